"""Dataset manifests: JSON Lines, one `{"path": ...}` or `{"url": ...}` object a line, plus
labels. `avafs warmup --manifest` and the training adapters read the same files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import AvafsError


def read_manifest(path: Path) -> Iterator[dict[str, Any]]:
    """Entries of a manifest; a bad line is an error naming the file and the line."""
    try:
        lines = path.open()
    except OSError as error:
        raise AvafsError(f"cannot read manifest {path}: {error.strerror}") from None
    with lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                raise AvafsError(f"manifest {path}, line {number}: not valid JSON "
                                 f"({error.msg})") from None
            if not isinstance(entry, dict) or not isinstance(
                    entry.get("path", entry.get("url")), str):
                raise AvafsError(f"manifest {path}, line {number}: each line needs a \"path\" "
                                 "or \"url\" string")
            yield entry
