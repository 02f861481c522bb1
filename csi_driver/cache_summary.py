"""Bytes this node's avafs caches hold per volume source, for the GPU scheduler's locality score.

Published by the plugin as a node annotation when it runs with `--publish-cache-interval`
(see gpu_sched/locality.py for the format and the rate bound). A source shared by several
volumes counts its largest cache: the caches hold copies of the same objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .state import StateDir


def _disk_usage(root: Path) -> int:
    """Bytes allocated to regular files under root (sparse holes not counted); 0 if it is gone."""
    total = 0
    pending = [root]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total


def _public(url: str) -> str:
    """The URL without user:password@, which must never reach a node annotation."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def cached_bytes_by_source(state: StateDir) -> dict[str, int]:
    totals: dict[str, int] = {}
    for record in state.volumes():
        size = _disk_usage(Path(record.cache_dir))
        for url in record.spec.urls():
            key = _public(url)
            totals[key] = max(totals.get(key, 0), size)
    return totals
