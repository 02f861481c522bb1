"""What the kernel has mounted where, whether it still answers, and bind mounts.

The kernel's mount table (/proc/self/mountinfo), not the driver's records, decides whether a
path is mounted: it is the one source that survives every crash. A FUSE mount whose daemon
died stays in the table but answers every access with ENOTCONN ("Transport endpoint is not
connected"); so does every bind mount taken from it, and a new FUSE mount at the same place
does not revive them. Such mounts are detached lazily (MNT_DETACH), because a process in a
pod may still hold a file open in them.

Mounts are made with mount(2) and umount2(2) directly: exact flags, no dependence on the
util-linux version in the image, and errno values to act on instead of parsed messages.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from avafs.host.mounts import AVAFS_FSTYPE, MountEntry, mount_at, mount_table, normalize

__all__ = ["AVAFS_FSTYPE", "MountEntry", "mount_at", "mount_table", "normalize"]

_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

_DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)
PROBE_TIMEOUT = 10.0
"""Seconds a statfs() of a mount may take before the mount counts as unresponsive."""


class Health(enum.Enum):
    ABSENT = "absent"
    NOT_MOUNTED = "not mounted"
    HEALTHY = "mounted"
    DEAD = "dead: its FUSE daemon is gone (ENOTCONN)"
    UNRESPONSIVE = f"unresponsive: statfs() took longer than {PROBE_TIMEOUT:.0f}s"


@dataclass(frozen=True)
class Probe:
    health: Health
    entry: MountEntry | None


_Result = TypeVar("_Result")


def call_with_timeout(function: Callable[[], _Result], timeout: float) -> _Result:
    """Run a filesystem call that may block forever on a stuck FUSE daemon.

    A thread stuck in the kernel cannot be cancelled; it is left behind as a daemon thread
    and the caller gets TimeoutError instead of hanging with it.
    """
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:  # noqa: BLE001 - handed to the calling thread
            outcome.append((False, error))

    worker = threading.Thread(target=run, daemon=True, name="fs-call")
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise TimeoutError(f"filesystem call did not return within {timeout:.0f}s")
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def probe(path: str) -> Probe:
    """How the mount at `path` is doing, asked of the filesystem itself.

    statfs(2), not stat(2): the kernel answers stat() of a FUSE inode from its attribute
    cache for as long as the attribute timeout runs, even after the daemon died, while
    every statfs() is a request to the daemon, so a dead one shows at once.
    """
    entry = mount_at(path)
    try:
        call_with_timeout(lambda: os.statvfs(path), PROBE_TIMEOUT)
    except TimeoutError:
        return Probe(Health.UNRESPONSIVE, entry)
    except FileNotFoundError:
        return Probe(Health.ABSENT, entry)
    except OSError as error:
        if error.errno in _DEAD_ERRNOS:
            return Probe(Health.DEAD, entry)
        raise
    return Probe(Health.HEALTHY if entry else Health.NOT_MOUNTED, entry)


def _mount(source: str | None, target: str, flags: int) -> None:
    result = _libc.mount(source.encode() if source else None, target.encode(), None, flags, None)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source} on {target}: {os.strerror(code)}")


def bind_mount(source: str, target: str, read_only: bool) -> None:
    """Bind `source` onto `target`; nosuid and nodev always, since a bucket is user data.

    A bind ignores flags; they take effect on the remount that follows. Should the remount
    fail, the writable bind is removed rather than left where a pod asked for read-only.
    """
    _mount(source, target, _MS_BIND)
    flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if read_only else 0)
    try:
        _mount(None, target, flags)
    except OSError:
        detach(target)
        raise


def detach(path: str) -> None:
    """Remove every mount stacked at `path`, lazily: open files keep working until closed."""
    for _ in range(64):
        if mount_at(path) is None:
            return
        if _libc.umount2(path.encode(), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL:
                return
            raise OSError(code, f"umount {path}: {os.strerror(code)}")
    raise OSError(errno.EBUSY, f"umount {path}: more than 64 mounts stacked there")


def statvfs(path: str) -> os.statvfs_result:
    return call_with_timeout(lambda: os.statvfs(path), PROBE_TIMEOUT)
