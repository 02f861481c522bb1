"""The snapshot record: what one snapshot holds, and its bytes in the store.

Two gzip members in one object: the first is the summary (name, source, prefix, time, counts)
as JSON, so `avafs snapshot list` reads a few KiB of each record (`HEADER_READ`) instead of
the whole; the second is the files, `[key, size, etag, mtime, version id or null]` each,
sorted by key. One object is written with one PUT, so a snapshot exists whole or not at all.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import asdict, dataclass

from ..config.options import snapshot_name
from ..errors import AvafsError
from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs

FORMAT = 1
HEADER_READ = 64 * 2**10
"""Bytes read from the start of a record for its summary: far more than one takes."""


def check_name(name: str) -> str:
    """`name` if it may name a snapshot (`snapshot_name`), else a one-line error."""
    try:
        return snapshot_name(name)
    except ValueError as error:
        raise AvafsError(f"invalid snapshot name: {error}") from None


@dataclass(frozen=True, slots=True)
class RecordedFile:
    key: str
    size: int
    etag: str
    mtime: float
    version_id: str | None

    def info(self) -> ObjectInfo:
        """The file as a snapshot mount shows it: its attributes are the mount's defaults and
        count as read (a record keeps no modes or owners), so no lookup asks the store."""
        return ObjectInfo(self.key, self.size, self.etag, self.mtime, Attrs())


@dataclass(frozen=True, slots=True)
class Summary:
    """What `avafs snapshot list` shows of a snapshot."""

    name: str
    source: str
    """The URL of the source it was made of; keys are relative to it."""
    prefix: str
    """The directory of the source it records ('' for the whole source)."""
    created: float
    files: int
    bytes: int
    versioned: bool
    """Whether every file's version id was recorded (the bucket keeps versions)."""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Snapshot:
    summary: Summary
    files: tuple[RecordedFile, ...]


def make(name: str, source: str, prefix: str, created: float,
         found: list[tuple[ObjectInfo, str | None]]) -> Snapshot:
    files = tuple(sorted((RecordedFile(info.key, info.size, info.etag, info.mtime, version)
                          for info, version in found), key=lambda file: file.key))
    return Snapshot(Summary(name, source, prefix, created, len(files),
                            sum(file.size for file in files),
                            bool(files) and all(file.version_id for file in files)), files)


def encode(snapshot: Snapshot) -> bytes:
    header = json.dumps({"format": FORMAT, **snapshot.summary.as_dict()}).encode()
    body = json.dumps({"files": [[file.key, file.size, file.etag, file.mtime, file.version_id]
                                 for file in snapshot.files]},
                      separators=(",", ":")).encode()
    return gzip.compress(header, mtime=0) + gzip.compress(body, mtime=0)


def _damaged(where: str, problem: str) -> AvafsError:
    return AvafsError(f"snapshot record {where} is damaged ({problem}): delete it with "
                      "'avafs snapshot delete' and make it again")


def _first_member(data: bytes, where: str) -> tuple[Summary, bytes]:
    """The summary, and the bytes after its gzip member."""
    member = zlib.decompressobj(wbits=31)
    try:
        header = json.loads(member.decompress(data))
        if not member.eof:
            raise ValueError("its summary is cut short")
        if header.pop("format") != FORMAT:
            raise ValueError(f"format {header.get('format')} is not {FORMAT}: a newer avafs "
                             "made it")
        return Summary(**header), member.unused_data
    except (zlib.error, ValueError, TypeError, KeyError) as error:
        raise _damaged(where, str(error)) from None


def decode_summary(start: bytes, where: str) -> Summary:
    """The summary from the first bytes of a record (at least its first member)."""
    return _first_member(start, where)[0]


def decode(data: bytes, where: str) -> Snapshot:
    summary, rest = _first_member(data, where)
    try:
        files = tuple(RecordedFile(key, int(size), etag, float(mtime), version)
                      for key, size, etag, mtime, version
                      in json.loads(gzip.decompress(rest))["files"])
    except (OSError, EOFError, zlib.error, ValueError, TypeError, KeyError) as error:
        raise _damaged(where, str(error) or type(error).__name__) from None
    if len(files) != summary.files:
        raise _damaged(where, f"{len(files)} files where its summary says {summary.files}")
    return Snapshot(summary, files)
