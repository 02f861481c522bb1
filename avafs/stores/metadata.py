"""POSIX attributes kept in object metadata, in the convention other S3 file tools share.

An object may carry `x-amz-meta-mtime` (Unix seconds, fractional), `x-amz-meta-mode` (a decimal
`st_mode`, file type bits included), `x-amz-meta-uid` and `x-amz-meta-gid` (decimal). Objects
written by those tools read back with their times, modes and owners, and theirs with ours. A
listing carries no metadata, so attributes are read with a HEAD the first time a file is
stat'ed (see `ObjectInfo.attrs`). Values that do not parse are ignored, not fatal: one bad
header must not hide the object.
"""

from __future__ import annotations

import math
import stat
from collections.abc import Mapping
from dataclasses import dataclass

MTIME, MODE, UID, GID = "mtime", "mode", "uid", "gid"


@dataclass(frozen=True, slots=True)
class Attrs:
    """What an object's metadata says of its file; None: not set, the mount's default holds."""

    mode: int | None = None
    """Permission bits only (`0o7777`)."""
    uid: int | None = None
    gid: int | None = None


def encode(mtime: float | None, attrs: Attrs) -> dict[str, str]:
    """User metadata (without the `x-amz-meta-` prefix) for a file with these attributes;
    without an mtime (None) the object's upload time stands for it."""
    metadata: dict[str, str] = {}
    if mtime is not None:
        nanoseconds = round(mtime * 1e9)
        metadata[MTIME] = f"{nanoseconds // 10**9}.{nanoseconds % 10**9:09d}"
    if attrs.mode is not None:
        metadata[MODE] = str(stat.S_IFREG | attrs.mode)
    if attrs.uid is not None:
        metadata[UID] = str(attrs.uid)
    if attrs.gid is not None:
        metadata[GID] = str(attrs.gid)
    return metadata


def decode(metadata: Mapping[str, str]) -> tuple[float | None, Attrs]:
    """(mtime or None, attributes) from user metadata, keys in any case."""
    lowered = {key.lower(): value for key, value in metadata.items()}
    return _seconds(lowered.get(MTIME)), Attrs(
        mode=_whole(lowered.get(MODE), 0o7777), uid=_whole(lowered.get(UID)),
        gid=_whole(lowered.get(GID)))


def _seconds(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _whole(text: str | None, mask: int | None = None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    if mask is not None:
        return value & mask
    return value if value < 2**32 else None
