"""Whether a disk tier's size fits the file system its cache dir is on.

The disk tier keeps to `--disk-cache`, not to the file system's free space: a size larger than
the room there fills the disk (and everything else on it) before the tier starts evicting. A
mount warns rather than refuses: space can be freed or a volume grown, and a dataset smaller
than the room left is cached all the same.
"""

from __future__ import annotations

import os
from pathlib import Path

from .sizes import format_size


def disk_cache_warning(cache_dir: Path, capacity: int, held: int) -> str | None:
    """A one-line warning if `capacity` bytes do not fit in `cache_dir`'s file system: its
    free space plus what the cache dir already `held` (its cached blocks and written files,
    which count toward the tier); None if they fit."""
    info = os.statvfs(cache_dir)
    room = info.f_bavail * info.f_frsize + held
    if capacity <= room:
        return None
    return (f"--disk-cache {format_size(capacity)} is more than the file system of {cache_dir} "
            f"has room for ({format_size(room)}, counting what the cache holds): the disk "
            "fills up before the cache evicts; give a smaller --disk-cache or a --cache-dir "
            "with more room")
