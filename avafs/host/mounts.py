"""What the kernel has mounted where (/proc/self/mountinfo), and dead FUSE mounts.

The kernel's mount table is the one record that survives every crash, so the CLI, the Python
client and the CSI driver all ask it, through this module, rather than keeping their own.
"""

from __future__ import annotations

import errno
import os
import select
from dataclasses import dataclass
from pathlib import Path

AVAFS_FSTYPE = "fuse.avafs"


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo (proc(5))."""

    mount_id: int
    device: str
    """major:minor of the filesystem; every bind mount of one FUSE mount shares it."""
    root: str
    """The directory of the filesystem this mount shows: "/" or, for a bind, the subdir."""
    mount_point: str
    options: tuple[str, ...]
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as three-digit octal escapes."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def mount_table() -> list[MountEntry]:
    entries = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            separator = fields.index("-")
            entries.append(MountEntry(
                mount_id=int(fields[0]), device=fields[2], root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]), options=tuple(fields[5].split(",")),
                fstype=fields[separator + 1], source=_unescape(fields[separator + 2])))
    return entries


def device_mounted(device: str) -> bool:
    """Whether any mount of `device` (a filesystem, any of its bind mounts) is in this
    process's mount namespace."""
    return any(entry.device == device for entry in mount_table())


def wait_until_unmounted(device: str) -> None:
    """Returns once no mount of `device` is left in this process's mount namespace. Sleeps in
    poll(2) on /proc/self/mountinfo, which the kernel wakes at every change of the namespace's
    mounts; the file is opened before the table is read, so a change in between still wakes
    the poll."""
    descriptor = os.open("/proc/self/mountinfo", os.O_RDONLY)
    try:
        poller = select.poll()
        poller.register(descriptor, select.POLLPRI)
        while device_mounted(device):
            poller.poll()
    finally:
        os.close(descriptor)


def normalize(path: str | os.PathLike[str]) -> str:
    """An absolute, normalized path; symlinks are not resolved (that would stat dead mounts)."""
    return os.path.normpath(os.path.abspath(path))


def mount_at(path: str | os.PathLike[str]) -> MountEntry | None:
    """The topmost mount whose mount point is exactly `path` (later lines cover earlier)."""
    target = normalize(path)
    found = None
    for entry in mount_table():
        if entry.mount_point == target:
            found = entry
    return found


def containing_mount(path: str | os.PathLike[str]) -> MountEntry | None:
    """The mount a path lies in (the deepest mount point above it, the topmost there)."""
    target = Path(normalize(path))
    best = None
    for entry in mount_table():
        point = Path(entry.mount_point)
        if (target == point or point in target.parents) and (
                best is None or len(point.parts) >= len(Path(best.mount_point).parts)):
            best = entry
    return best


def is_dead(path: str | os.PathLike[str]) -> bool:
    """True for a FUSE mount whose daemon is gone ("Transport endpoint is not connected").

    Probed with statfs because the kernel answers stat from its attribute cache even after the
    daemon died, while statfs always goes to the daemon.
    """
    try:
        os.statvfs(path)
    except OSError as error:
        return error.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False
