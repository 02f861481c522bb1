"""A mount of a snapshot: an ObjectStore that answers from the record and reads each file's
recorded version.

Listings and attributes come from the record alone, so the tree is exactly the recorded one
whatever the bucket holds now, and cost no request. A file's bytes are its recorded version:
read by version id where the record has one (the bucket keeps versions), else by ETag, as
every read is. The tiers name cached blocks by ETag, so the node's and the cluster tier's
blocks of the recorded version serve it before this store is asked; only a block no tier
holds reaches `get_range`, and if the object has changed since (no version to read) the read
fails with `SnapshotVersionGone` (EIO), logged once per file: never the new bytes.

Everything that would write raises: a snapshot mount is `--read-only`, so nothing calls them.
"""

from __future__ import annotations

import io
import logging
import threading
from typing import BinaryIO

from ..errors import ObjectChangedError, SnapshotVersionGone, StoreError
from ..stores.base import Listing, ObjectInfo, ObjectStore
from ..stores.metadata import Attrs
from .record import RecordedFile, Snapshot

log = logging.getLogger(__name__)


def _tree(files: tuple[RecordedFile, ...]) -> dict[str, Listing]:
    """Each directory's listing (sub-prefixes and files directly under it), by prefix."""
    prefixes: dict[str, set[str]] = {"": set()}
    objects: dict[str, list[ObjectInfo]] = {"": []}
    for file in files:
        parent = file.key[:file.key.rfind("/") + 1]
        objects.setdefault(parent, []).append(file.info())
        while parent:
            above = parent[:parent.rfind("/", 0, len(parent) - 1) + 1]
            children = prefixes.setdefault(above, set())
            if parent in children:
                break
            children.add(parent)
            parent = above
    return {prefix: Listing(sorted(prefixes.get(prefix, ())), objects.get(prefix, []))
            for prefix in prefixes.keys() | objects.keys()}


class SnapshotStore(ObjectStore):
    def __init__(self, origin: ObjectStore, snapshot: Snapshot) -> None:
        self.origin = origin
        self.snapshot = snapshot
        self.name = snapshot.summary.name
        self.url = origin.url
        self._files = {file.key: file for file in snapshot.files}
        self._listings = _tree(snapshot.files)
        self._reported: set[str] = set()
        """Files whose recorded version could not be read, already logged (_lock)."""
        self._lock = threading.Lock()

    @property
    def unreachable_since(self) -> float | None:  # type: ignore[override]
        return self.origin.unreachable_since

    @property
    def last_error(self) -> str | None:  # type: ignore[override]
        return self.origin.last_error

    def files(self) -> tuple[RecordedFile, ...]:
        return self.snapshot.files

    def check(self) -> None:
        self.origin.check()

    def list_dir(self, prefix: str) -> Listing:
        return self._listings.get(prefix, Listing([], []))

    def head(self, key: str) -> ObjectInfo | None:
        file = self._files.get(key)
        return None if file is None else file.info()

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        file = self._recorded(key, etag)
        try:
            if file.version_id:
                return self.origin.get_version_range(key, start, length, file.version_id)
            return self.origin.get_range(key, start, length, etag)
        except ObjectChangedError:
            raise self._gone(file) from None

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        file = self._recorded(key, etag)
        if file.version_id:
            return io.BytesIO(self.get_range(key, start, length, etag))
        try:
            return self.origin.open_range(key, start, length, etag)
        except ObjectChangedError:
            raise self._gone(file) from None

    def _recorded(self, key: str, etag: str) -> RecordedFile:
        file = self._files.get(key)
        if file is None or file.etag != etag:
            raise StoreError(f"{key!r} is not in snapshot {self.name!r} as version {etag}",
                             permanent=True)
        return file

    def _gone(self, file: RecordedFile) -> SnapshotVersionGone:
        """The error of a file whose recorded version the store no longer has: logged here,
        once per file, so a reader's retries add no line."""
        message = (f"{file.key} of snapshot {self.name!r} ({self.url}) has changed in the "
                   f"store since the snapshot and no tier holds its recorded version (ETag "
                   f"{file.etag}): not served")
        with self._lock:
            first = file.key not in self._reported
            self._reported.add(file.key)
        if first:
            log.error("%s", message)
        return SnapshotVersionGone(message, permanent=True)

    def _read_only(self) -> StoreError:
        return StoreError(f"snapshot {self.name!r} of {self.url} is read-only", permanent=True)

    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
        raise self._read_only()

    def delete(self, key: str) -> None:
        raise self._read_only()

    def copy(self, source_key: str, key: str, etag: str, mtime: float | None = None,
             attrs: Attrs | None = None) -> ObjectInfo:
        raise self._read_only()
