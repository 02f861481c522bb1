"""POSIX attributes kept in object metadata, in the convention other S3 file tools share.

An object may carry `x-amz-meta-mtime`, `x-amz-meta-atime` and `x-amz-meta-ctime` (Unix seconds,
fractional), `x-amz-meta-mode` (a decimal `st_mode`, file type bits included),
`x-amz-meta-uid`, `x-amz-meta-gid` and `x-amz-meta-rdev` (decimal). Objects written by those tools
read back with their times, modes, owners and file types, and theirs with ours. The file type
is what makes an object a symbolic link (its body is the target), a FIFO, a socket or a device
node; a directory marker object (`prefix/`) carries its directory's attributes the same way.
A listing carries no metadata, so attributes are read with a HEAD the first time a file is
stat'ed (see `ObjectInfo.attrs`). Values that do not parse are ignored, not fatal: one bad
header must not hide the object.
"""

from __future__ import annotations

import math
import stat
from collections.abc import Mapping
from dataclasses import dataclass

MTIME, ATIME, CTIME, MODE, UID, GID, RDEV = "mtime", "atime", "ctime", "mode", "uid", "gid", "rdev"
SPECIAL_TYPES = frozenset({stat.S_IFLNK, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR,
                           stat.S_IFBLK})
"""File types an object can stand for besides a regular file and a directory marker."""
KEPT_TYPES = SPECIAL_TYPES | {stat.S_IFREG, stat.S_IFDIR}


@dataclass(frozen=True, slots=True)
class Attrs:
    """What an object's metadata says of its file; None: not set, the mount's default holds
    (for `file_type`: a regular file; for `atime` and `ctime`: the mtime)."""

    mode: int | None = None
    """Permission bits only (`0o7777`)."""
    uid: int | None = None
    gid: int | None = None
    file_type: int | None = None
    """`stat.S_IFMT` bits of a file that is not a regular one (SPECIAL_TYPES, or S_IFDIR for
    a directory marker)."""
    rdev: int | None = None
    atime: float | None = None
    ctime: float | None = None

    def fields(self) -> list[int | float | None]:
        """Every field in declaration order, for journals and records (`Attrs(*fields)`;
        records written before the later fields existed still load)."""
        return [self.mode, self.uid, self.gid, self.file_type, self.rdev, self.atime,
                self.ctime]


def encode(mtime: float | None, attrs: Attrs) -> dict[str, str]:
    """User metadata (without the `x-amz-meta-` prefix) for a file with these attributes;
    without an mtime (None) the object's upload time stands for it."""
    metadata: dict[str, str] = {}
    if mtime is not None:
        metadata[MTIME] = _time_text(mtime)
    for name, value in ((ATIME, attrs.atime), (CTIME, attrs.ctime)):
        if value is not None:
            metadata[name] = _time_text(value)
    file_type = attrs.file_type or stat.S_IFREG
    if attrs.mode is not None or file_type != stat.S_IFREG:
        default = 0o777 if file_type == stat.S_IFLNK else 0o644
        metadata[MODE] = str(file_type | (default if attrs.mode is None else attrs.mode))
    for name, value in ((UID, attrs.uid), (GID, attrs.gid), (RDEV, attrs.rdev)):
        if value is not None:
            metadata[name] = str(value)
    return metadata


def _time_text(seconds: float) -> str:
    nanoseconds = round(seconds * 1e9)
    return f"{nanoseconds // 10**9}.{nanoseconds % 10**9:09d}"


def decode(metadata: Mapping[str, str]) -> tuple[float | None, Attrs]:
    """(mtime or None, attributes) from user metadata, keys in any case. A mode whose type is
    none of KEPT_TYPES is read as a regular file's."""
    lowered = {key.lower(): value for key, value in metadata.items()}
    mode = _whole(lowered.get(MODE))
    file_type = None if mode is None else stat.S_IFMT(mode)
    return _seconds(lowered.get(MTIME)), Attrs(
        mode=None if mode is None else mode & 0o7777, uid=_whole(lowered.get(UID)),
        gid=_whole(lowered.get(GID)),
        file_type=file_type if file_type in KEPT_TYPES - {stat.S_IFREG} else None,
        rdev=_whole(lowered.get(RDEV)), atime=_seconds(lowered.get(ATIME)),
        ctime=_seconds(lowered.get(CTIME)))


def _seconds(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _whole(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if value < 2**32 else None
