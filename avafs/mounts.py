"""What the kernel says is mounted where (/proc/self/mountinfo), and dead FUSE mounts."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

AVAFS_FSTYPE = "fuse.avafs"


@dataclass(frozen=True)
class MountEntry:
    mountpoint: Path
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def mount_entries() -> list[MountEntry]:
    entries = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            separator = fields.index("-")
            entries.append(MountEntry(Path(_unescape(fields[4])), fields[separator + 1],
                                      _unescape(fields[separator + 2])))
    return entries


def mount_at(path: Path) -> MountEntry | None:
    """The topmost mount whose mountpoint is exactly `path`."""
    target = Path(os.path.abspath(path))
    found = None
    for entry in mount_entries():
        if entry.mountpoint == target:
            found = entry
    return found


def containing_mount(path: Path) -> MountEntry | None:
    """The mount a path lies in (the deepest mountpoint above it)."""
    target = Path(os.path.abspath(path))
    best = None
    for entry in mount_entries():
        if (target == entry.mountpoint or entry.mountpoint in target.parents) and (
                best is None or len(entry.mountpoint.parts) >= len(best.mountpoint.parts)):
            best = entry
    return best


def is_dead(path: Path) -> bool:
    """True for a FUSE mount whose daemon is gone ("Transport endpoint is not connected").

    Probed with statfs because the kernel answers stat from its attribute cache even after the
    daemon died, while statfs always goes to the daemon.
    """
    try:
        os.statvfs(path)
    except OSError as error:
        return error.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False
