"""Dataset manifests: JSON Lines, one sample a line, in the format README.md documents
("Warmup, status, metrics").

Each line is an object with `"path"` (relative to the mount root) or `"url"` (`s3://bucket/key`,
or `file:///dir/key` for a local bucket), plus any label fields. `avafs warmup --manifest` and
the training adapters read the same files through this one parser, so a job warms exactly what
it will read. Errors carry the line number because manifests are written by people and scripts
and are often millions of lines long.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import AvafsError

LOCATION_FIELDS = ("path", "url")
URL_SCHEMES = ("s3://", "file://")


class ManifestError(AvafsError, ValueError):
    """A manifest line cannot be used; the message starts with `FILE:LINE:`."""


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    line: int
    path: str | None
    url: str | None
    labels: dict[str, Any]

    def location(self) -> dict[str, str]:
        """The entry as the control socket takes it: {"path": ...} or {"url": ...}."""
        return {"path": self.path} if self.path is not None else {"url": self.url}


def read_manifest(manifest: str | os.PathLike[str]) -> Iterator[ManifestEntry]:
    """Entries in file order; blank lines are allowed, anything else malformed is an error."""
    try:
        lines = open(manifest, encoding="utf-8")  # noqa: SIM115 - closed by the with below
    except OSError as error:
        raise ManifestError(f"{os.fspath(manifest)}: cannot read: {error.strerror}") from None
    with lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield _parse_line(manifest, number, line)


def _parse_line(manifest: str | os.PathLike[str], number: int, line: str) -> ManifestEntry:
    where = f"{os.fspath(manifest)}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ManifestError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") \
            from None
    if not isinstance(record, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(record).__name__}")
    present = [field for field in LOCATION_FIELDS if field in record]
    if len(present) != 1:
        raise ManifestError(f'{where}: needs exactly one of "path" or "url", found '
                            f'{present or "neither"}')
    field = present[0]
    location = record.pop(field)
    if not isinstance(location, str) or not location:
        raise ManifestError(f'{where}: "{field}" must be a non-empty string')
    if field == "path" and (os.path.isabs(location) or ".." in location.split("/")):
        raise ManifestError(f'{where}: "path" must be relative to the mount root and stay '
                            f"inside it: {location!r}")
    if field == "url" and not location.startswith(URL_SCHEMES):
        raise ManifestError(f'{where}: "url" must be an s3:// (or file://) URL, got '
                            f"{location!r}")
    return ManifestEntry(line=number, path=location if field == "path" else None,
                         url=location if field == "url" else None, labels=record)
