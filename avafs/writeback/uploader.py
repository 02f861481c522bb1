"""The uploader: worker threads that bring the store to each key's pending state.

Which state goes next, and whether a failed one is retried (with backoff, never given up
silently) or set aside, is upload_order.py's: the uploaders ask it and report back. An upload
reads the
local file through a guard that aborts it if the file is written meanwhile, or if its state was
cancelled (the file deleted or replaced), so the store never gets a snapshot mixing two versions
and a deleted file's upload stops at once; a changed key stays pending and goes again. A file
streamed while it was written (streaming.py) is finished instead, or uploaded whole if its
stream cannot complete.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from typing import BinaryIO

from ..errors import ObjectChangedError, StoreError
from ..objects import ObjectRef
from ..stores.base import ObjectInfo, ObjectStore
from ..stores.metadata import Attrs
from .file_views import FileView
from .manager import WriteBack
from .pending import COPY, DATA, DELETED, Pending
from .streaming import STREAM_FROM, StreamUploads
from .upload_memory import UploadMemory
from .upload_order import RenameSourceChanged

log = logging.getLogger(__name__)

_SAME_MTIME = 1e-5
"""Seconds two mtimes of one version may differ by: a float of seconds written as integer
nanoseconds (a local file's utime, an object's metadata) and read back moves by up to a
microsecond."""

UPLOAD_MEMORY = 4 * STREAM_FROM
"""Bytes the uploads in flight may hold together: what four of the largest ones held when
there were four uploaders."""


def _memory_held(entry: Pending) -> int:
    """What uploading `entry` holds in memory: a body sent in one PutObject is read whole
    (files below STREAM_FROM), a larger file keeps its parts in flight (STREAM_FROM of them,
    streaming.py and the store's managed upload alike); a deletion or a copy holds nothing."""
    return min(entry.size, STREAM_FROM) if entry.kind == DATA else 0


class ChangedDuringUpload(Exception):
    """The file was written while being uploaded; this snapshot must not reach the store."""


class GuardedReader(FileView):
    """File reads for an upload, valid only while the entry's generation stays the same."""

    def __init__(self, file: BinaryIO, entry: Pending, generation: int) -> None:
        super().__init__(file)
        self._entry = entry
        self._generation = generation

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        if self._entry.generation != self._generation or self._entry.cancelled:
            raise ChangedDuringUpload(self._entry.key)
        return data


class Uploader:
    def __init__(self, writeback: WriteBack, stores: dict[str, ObjectStore], workers: int) -> None:
        self.writeback = writeback
        self.stores = stores
        self.streams = StreamUploads(writeback.data_dir, stores, writeback.lock,
                                     writeback.journal)
        writeback.streams = self.streams
        self._stopping = False
        self._memory = UploadMemory(UPLOAD_MEMORY)
        self._threads = [threading.Thread(target=self._work, daemon=True,
                                          name=f"avafs-upload-{number}")
                         for number in range(workers)]
        for thread in self._threads:
            thread.start()

    def _claim(self) -> Pending | None:
        writeback = self.writeback
        with writeback.lock:
            while not self._stopping:
                entry = writeback.next_ready(time.monotonic())
                if entry is not None:
                    entry.uploading = True
                    return entry
                writeback.work.wait(0.2)
        return None

    def _work(self) -> None:
        while (entry := self._claim()) is not None:
            generation = entry.generation
            try:
                with self._memory.held(_memory_held(entry)):
                    info = self._apply(entry, generation)
            except Exception as error:  # noqa: BLE001 - every failure is retried
                self.writeback.failed(entry, error)
                continue
            self.writeback.settled(entry, generation, info)

    def _apply(self, entry: Pending, generation: int):
        store = self.stores[entry.source]
        if entry.kind == DELETED:
            store.delete(entry.key)
            return None
        if entry.kind == COPY and entry.copy_in:
            self._copy_in_source(store, entry, generation)
            return None  # not settled: a DATA state now, uploaded once its turn comes
        if entry.kind == COPY:
            with self.streams.intent(store, entry.source, entry.key, entry.size):
                try:
                    return store.copy(entry.copy_from, entry.key, entry.copy_etag,
                                      None if entry.attrs is None else entry.mtime, entry.attrs)
                except ObjectChangedError as error:
                    if entry.copy_from == entry.key:
                        return self._reapply_attributes(store, entry)
                    landed = self._copy_landed(store, entry)
                    if landed is None:
                        raise RenameSourceChanged(  # not ours to move
                            str(error), store.head(entry.copy_from)) from error
                    return landed
        assert entry.kind == DATA
        attrs = entry.attrs or Attrs()
        completed = self.streams.finish(entry, generation) if entry.stream is not None \
            else None
        if completed is None:
            completed = self.streams.upload_in_parts(entry, generation)
        if completed is not None:
            if completed.carries_attributes:
                return completed.info
            # Its attributes changed after the upload began, or its mtime was set: the
            # object is copied onto itself with them.
            with self.streams.intent(store, entry.source, entry.key, entry.size):
                return store.copy(entry.key, entry.key, completed.info.etag, entry.mtime, attrs)
        if entry.size >= STREAM_FROM and store.multipart() is not None:
            # Only journaled parts may carry a file this large (a managed upload's id is
            # known to no journal); it changed while they went up.
            raise StoreError(f"{entry.key!r} changed while it went up in parts; it goes up "
                             "again")
        path = self.writeback.data_path(entry)
        if path is None:  # a directory marker or a special file: its metadata is all it holds
            return store.put(entry.key, io.BytesIO(b""), 0,
                             None if entry.attrs is None else entry.mtime, entry.attrs)
        with open(path, "rb") as file:
            return store.put(entry.key, GuardedReader(file, entry, generation), entry.size,
                             entry.mtime, attrs)

    def _copy_in_source(self, store: ObjectStore, entry: Pending, generation: int) -> None:
        """Make the copy a DATA state of its source's version with what the copy would have
        carried: its own attributes, else the source's, read from the store."""
        mtime, attrs = entry.mtime, entry.attrs
        if attrs is None:
            mtime, attrs = store.copied_attributes(entry.copy_from, entry.copy_etag)
        self.writeback.copy_in_source(entry, generation, ObjectRef(
            entry.source, store, entry.copy_from, entry.copy_etag, entry.size), mtime, attrs)

    @staticmethod
    def _copy_landed(store: ObjectStore, entry: Pending) -> ObjectInfo | None:
        """The object a rename's copy makes, if the store holds it already though the source
        is gone: a node that took over this mount's queue while its lease had lapsed applied
        the rename (the copy, then the deletion of its source) from the records this mount
        staged. Recognized by its size and either the copied version's ETag (a copy of one
        part keeps it on S3) or the mtime the copy carries (a copy keeps its source's times,
        or sets the state's own: equal to within what a time loses on its way through
        nanoseconds and back to a float); None otherwise."""
        current = store.head(entry.key)
        if current is None or current.size != entry.size:
            return None
        if current.etag == entry.copy_etag or abs(current.mtime - entry.mtime) < _SAME_MTIME:
            log.info("rename of %r to %r: the store has the copy already (applied by the "
                     "node that took over this one's queue)", entry.copy_from, entry.key)
            return current
        return None

    @staticmethod
    def _reapply_attributes(store: ObjectStore, entry: Pending):
        """A change of attributes (a copy of the object onto itself) whose version was
        replaced meanwhile, by an upload of this mount that settled first or by another
        writer: the attributes were set on the file, whatever its bytes, so they go onto the
        version the store has now, as a chmod applies to an inode whatever it holds. None
        (settled as deleted) if the object is gone."""
        current = store.head(entry.key)
        if current is None:
            return None
        return store.copy(entry.key, entry.key, current.etag, entry.mtime, entry.attrs)

    def stop(self) -> None:
        self._stopping = True
        with self.writeback.lock:
            self.writeback.work.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)
        self.streams.stop()
