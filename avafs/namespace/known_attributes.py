"""Attributes of object versions read on this node before, kept in the cache dir (rocksdict), so
that a remount, whose disk tier still holds every byte, does not read every file's metadata
from the store again.

A listing carries no user metadata, so a file's mode, owner, type and times come from a request
for its object (a HEAD, or the GET of a small file's bytes). What that request found is
recorded against the version the listing showed: its ETag and the store's write time
(LastModified). A later listing of the same key is given those attributes back only when both
match; an object replaced since has another ETag, and one whose metadata another tool changed
in place (a copy onto itself, which keeps the ETag of a single-part object) has another write
time, so neither is shown what was recorded. A file this mount uploaded is recorded with its
ETag alone, as no write time comes back from an upload; the first listing that shows that ETag
pins the write time it shows.

One record per key, the latest version's, about a hundred bytes. Records are never needed for
correctness: a missing or unreadable one costs one request, as without the record. Written by
lister threads, FUSE handlers and upload threads at once; rocksdict serialises them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from rocksdict import Options, Rdict

from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs

log = logging.getLogger(__name__)


class KnownAttributes:
    def __init__(self, path: Path) -> None:
        self._records = Rdict(str(path), options=Options(raw_mode=True))

    def recall(self, url: str, listed: list[ObjectInfo]) -> list[ObjectInfo]:
        """Each listed object with the attributes recorded for its version where there is a
        record for it (one batched read), else as listed. Pins the write time of versions
        recorded by their uploader."""
        unread = [info for info in listed if info.attrs is None]
        if not unread:
            return listed
        keys = [_record_key(url, info.key) for info in unread]
        found: dict[str, ObjectInfo] = {}
        for key, info, raw in zip(keys, unread, self._records[keys], strict=True):
            if raw is None:
                continue
            record = _decode(raw)
            if record is None or record["etag"] != info.etag:
                continue
            if record["listed_mtime"] is None:
                record["listed_mtime"] = info.mtime
                self._records[key] = json.dumps(record).encode()
            elif record["listed_mtime"] != info.mtime:
                continue
            found[info.key] = dataclasses.replace(info, mtime=record["mtime"],
                                                  attrs=Attrs(*record["attrs"]))
        return [found.get(info.key, info) for info in listed] if found else listed

    def remember(self, url: str, key: str, listed: ObjectInfo | None,
                 found: ObjectInfo | None) -> None:
        """`found`, read from the store, holds the attributes of the version of `key` a
        listing showed as `listed`; `listed` None: a version this mount uploaded, not listed
        yet; `found` None: the key was deleted here, and its record goes."""
        if found is None:
            del self._records[_record_key(url, key)]
            return
        if found.attrs is None or (listed is not None and listed.etag != found.etag):
            return
        record = {"etag": found.etag, "listed_mtime": None if listed is None else listed.mtime,
                  "mtime": found.mtime, "attrs": found.attrs.fields()}
        self._records[_record_key(url, key)] = json.dumps(record).encode()

    def close(self) -> None:
        self._records.close()


def _record_key(url: str, key: str) -> bytes:
    return f"{url}\0{key}".encode()


def _decode(raw: bytes) -> dict | None:
    """A record, or None for one that does not parse (written by a later version, or torn)."""
    try:
        record = json.loads(raw)
        Attrs(*record["attrs"])
        return record if {"etag", "listed_mtime", "mtime"} <= record.keys() else None
    except (ValueError, KeyError, TypeError):
        log.debug("ignoring an unreadable attribute record")
        return None
