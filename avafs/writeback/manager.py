"""Write-back: written data lives on the local disk as dirty files until the store has it.

Why whole local files: checkpoints and logs are written sequentially and read back whole, and a
local file gives POSIX semantics (random writes, truncate, append, sqlite) for free; an existing
object is copied in once when it is first opened for writing. Dirty bytes count against the disk
tier, so clean blocks are evicted to make room for them and never the other way round. They are
counted per data file, as what the file takes on disk (a sparse file counts its allocated blocks,
not its length), for as long as the file lives: while a pending state names it or an open handle
holds it, so a file deleted while open keeps its bytes, and counts, until its last close.

Durability: `commit()` (FUSE flush and fsync, i.e. close() and fsync()) fsyncs the data file and
journals the pending state before it returns. Nothing leaves the journal until the store
acknowledged it, whatever fails meanwhile. Under `--writeback cluster` it first stages the file
in the cluster (cluster/queue.py, staging in cluster/staging.py), holding no lock, completing the staging upload a file
written front to back streamed while it was written (cluster/streams.py); a namespace change
(unlink, rename, mkdir, rmdir, attributes) puts its states' records once it is journaled. A
state that could not be staged stays node-durable and `restage` stages it again later.

The methods that change the states live in rooms, a part of WriteBack each: writing files
(writes.py), namespace changes (changes.py), what is uploaded next and what becomes of it
(upload_order.py), flush and status (flush.py), and cluster staging (cluster/staging.py); this
module holds the states, their index and accounting, and the lock that guards them all.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..metrics import Metrics
from ..objects import ObjectRef, allocated, parent_prefix
from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs
from .changes import NamespaceChanges
from .cluster.queue import ClusterQueue
from .cluster.staging import ClusterStaging
from .cluster.streams import ClusterStreams
from .flush import Flushing
from .journal import Journal
from .pending import COPY, DATA, Pending
from .streaming import StreamUploads
from .upload_order import UploadOrder
from .writes import FileWrites

log = logging.getLogger(__name__)

Settled = Callable[[str, str, ObjectInfo | None], None]
KeepCached = Callable[[str, ObjectInfo, Path], bool]
ReadObject = Callable[[ObjectRef, int, int], bytes | memoryview]
"""Reads `size` bytes at `offset` of an object version (blocks): how an existing object is
copied in when it is first opened for writing."""


class DirtySpace(Protocol):
    """The local disk space dirty data shares with the disk cache: dirty bytes are reserved
    from it (clean blocks make room for them, never the other way round)."""

    @property
    def capacity(self) -> int: ...

    def reserve(self, dirty_bytes: int) -> None: ...


class WriteBack(FileWrites, NamespaceChanges, UploadOrder, Flushing, ClusterStaging):
    """The pending states and their data files; the methods that change them live in rooms
    (module docstring)."""

    def __init__(self, directory: Path, read_object: ReadObject, space: DirtySpace,
                 metrics: Metrics, dirty_limit: int, sync_uploads: bool, delay: float) -> None:
        self.directory = directory
        self.data_dir = directory / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.read_object = read_object
        self.space = space
        self.metrics = metrics
        self.dirty_limit = dirty_limit
        self.sync_uploads = sync_uploads
        self.delay = delay
        self.on_settled: Settled = lambda source, key, info: None
        """Called, with the lock held, with what the store now has for a key (None: nothing)
        just before its pending state goes."""
        self.on_changed: Callable[[str, str], None] = lambda source, key: None
        """Called with (source, key) when the key's pending state comes or goes."""
        self.keep_cached: KeepCached = lambda source, info, path: False
        """Offered, with the lock held, the data file of a state that just settled as the
        version `info` of the source's key, once nothing else holds the file: True if it
        took the file (moved it away; the cache keeps it), else the file is removed. The lock
        order is this lock, then whatever the taker locks."""
        self.streams: StreamUploads | None = None
        """Uploads of files while they are written, where the stores take parts."""
        self.cluster: ClusterQueue | None = None
        """Under --writeback cluster, where committed files are staged (`enable_cluster`)."""
        self.cluster_streams: ClusterStreams | None = None
        """Under --writeback cluster, uploads of files to their staging objects while they
        are written."""
        self.source_urls: dict[str, str] = {}
        self.staged_bytes = 0
        """Bytes of this mount's pending states staged in the cluster store (their objects)."""
        self.staging_limit = 0
        """Staged bytes past which writers are slowed as past `dirty_limit` (0: no limit)."""
        self.may_upload: Callable[[], bool] = lambda: True
        """Whether the uploaders may start an upload now. Under --writeback cluster only while
        this node provably holds its queue (takeover.py): a taker uploading the node's records
        meanwhile must not have an older record land after a newer upload from here."""
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        """Wakes those waiting for keys to settle (close under --writeback sync, flush)."""
        self.work = threading.Condition(self.lock)
        """Wakes one idle uploader per key that became uploadable. Uploaders waited on
        `changed` before, so every close and every settled upload woke all of them and every
        waiter. Due times are found by the uploaders' own polling."""
        self._pending: dict[tuple[str, str], Pending] = {}
        self._order: OrderedDict[tuple[str, str], None] = OrderedDict()
        """Pending keys, least recently changed first: the order uploads become due in."""
        self._by_dir: dict[tuple[str, str], set[str]] = {}
        self._markers_by_dir: dict[tuple[str, str], set[str]] = {}
        """The keys of `_by_dir` that are directory markers (end in '/'), for what counts
        subdirectories without going through every pending file of a directory."""
        self._copy_sources: Counter[tuple[str, str]] = Counter()
        """Keys whose store version pending copies (renames) read: nothing else may change
        such a key in the store before they land."""
        self._in_flight: Counter[tuple[str, str]] = Counter()
        """Keys with an upload in flight, by the key it writes. A state that replaced the one
        being uploaded (a deletion, or the key's state after a rename moved a file away)
        waits for it: sent at once, it could land first and be undone by the older one."""
        self._file_refs: Counter[str] = Counter()
        self._file_dirty: dict[str, int] = {}
        """Bytes each live data file counts as dirty: what it takes on disk."""
        self.dirty_bytes = 0
        self.eager = False
        self.store_unreachable_since: float | None = None
        metrics.uploads_set_aside.set_function(lambda: len(self.set_aside()))
        self.journal = Journal(directory / "journal")
        self._seq = itertools.count(1)
        self._recover()

    def _recover(self) -> None:
        entries = self.journal.load()
        referenced = {entry.file for entry in entries if entry.file}
        for path in self.data_dir.iterdir():
            if path.name not in referenced:
                path.unlink()  # written but never committed: not acknowledged to anyone
        for entry in entries:
            if entry.staged and entry.kind == DATA and entry.file:
                entry.staged_bytes = entry.size
                self.staged_bytes += entry.size
            if entry.file:
                try:
                    status = os.stat(self.data_dir / entry.file)
                except FileNotFoundError:
                    log.error("journal names %s of %s but the file is gone; cannot upload it",
                              entry.file, entry.key)
                    self.journal.remove(entry)
                    continue
                # The file is what gets uploaded: a rename journals a file still being
                # written, whose length the crash may have left different.
                entry.size = status.st_size
                self._note_holes(entry, status.st_blocks * 512)
            self._index(entry)
        self._seq = itertools.count(max((e.seq for e in entries), default=0) + 1)
        self._account()
        if entries:
            log.info("write-back: %d pending changes from the journal (%d dirty bytes) will be "
                     "uploaded", len(self._pending), self.dirty_bytes)

    def _index(self, entry: Pending) -> None:
        """Make `entry` the state of its key; data files are reference-counted by states and
        open handles, and deleted (and no longer dirty) when the last one lets go."""
        if entry.file:
            self._file_refs[entry.file] += 1
            self._charge(entry)
        self._count_copy(entry, 1)
        old = self._pending.get(entry.slot)
        if old is not None:
            if old.slot == entry.slot:  # replaced, not moved to another key by a rename
                self._cancel(old)
                self._unstage(old)
            self._count_copy(old, -1)
            self._stop_streaming(old)
            if old.file:
                self._release_file(old.file)
        self._pending[entry.slot] = entry
        self._order[entry.slot] = None
        self._order.move_to_end(entry.slot)
        directory = (entry.source, parent_prefix(entry.key))
        self._by_dir.setdefault(directory, set()).add(entry.key)
        if entry.key.endswith("/"):
            self._markers_by_dir.setdefault(directory, set()).add(entry.key)
        self.on_changed(entry.source, entry.key)

    def _unindex(self, entry: Pending, stored: ObjectInfo | None = None) -> None:
        """`stored`: the version the store now has of the entry, whose bytes its data file
        holds, which the cache may keep (`keep_cached`)."""
        if self._pending.get(entry.slot) is not entry:
            return
        del self._pending[entry.slot]
        del self._order[entry.slot]
        self._cancel(entry)
        self._unstage(entry)
        self._count_copy(entry, -1)
        self._stop_streaming(entry)
        directory = (entry.source, parent_prefix(entry.key))
        for index in (self._by_dir, self._markers_by_dir):
            keys = index.get(directory)
            if keys is not None:
                keys.discard(entry.key)
                if not keys:
                    del index[directory]
        self.on_changed(entry.source, entry.key)
        if entry.file:
            self._release_file(entry.file, None if stored is None else (entry.source, stored))

    def _read_by_other_copies(self, entry: Pending) -> bool:
        """Whether pending copies other than `entry` itself read its key (a change of
        attributes copies a key onto itself, and must not wait for itself)."""
        itself = entry.kind == COPY and entry.copy_from == entry.key
        return self._copy_sources[entry.slot] > itself

    def _count_copy(self, entry: Pending, step: int) -> None:
        if entry.kind == COPY:
            source = (entry.source, entry.copy_from)
            self._copy_sources[source] += step
            if self._copy_sources[source] <= 0:
                del self._copy_sources[source]

    def _release_file(self, name: str, stored: tuple[str, ObjectInfo] | None = None) -> None:
        """`stored`: (source, version) the file's bytes are in the store, if the cache may
        keep it (`keep_cached`) when this was its last holder."""
        self._file_refs[name] -= 1
        if self._file_refs[name] <= 0:
            del self._file_refs[name]
            self.dirty_bytes -= self._file_dirty.pop(name, 0)
            path = self.data_dir / name
            if stored is None or not self.keep_cached(*stored, path):
                path.unlink(missing_ok=True)

    def _charge(self, entry: Pending) -> None:
        """Count the entry's data file, while it lives, as what it takes on disk."""
        if entry.file in self._file_refs:
            on_disk = allocated(entry.size) if entry.allocated is None else entry.allocated
            self.dirty_bytes += on_disk - self._file_dirty.get(entry.file, 0)
            self._file_dirty[entry.file] = on_disk

    def _resize(self, entry: Pending, size: int) -> None:
        entry.size = size
        self._charge(entry)

    @staticmethod
    def _note_holes(entry: Pending, on_disk: int) -> None:
        entry.allocated = on_disk if on_disk < allocated(entry.size) else None

    def measure(self, entry: Pending, fd: int) -> None:
        """Count a data file with holes as the blocks it has (after a write or truncate of
        one whose `allocated` is set): its length would count a hole as written data."""
        on_disk = os.fstat(fd).st_blocks * 512
        with self.lock:
            self._note_holes(entry, on_disk)
            self._charge(entry)
            self._account()

    @staticmethod
    def _cancel(entry: Pending) -> None:
        """`entry` is no longer its key's state: an upload of it in flight stops at its next
        read (the key's next state waits for it through `_in_flight`)."""
        entry.cancelled = True

    def _stop_streaming(self, entry: Pending) -> None:
        entry.appended_to = None
        if entry.stream is not None and self.streams is not None:
            self.streams.cancel(entry)
        if entry.cluster_stream is not None and self.cluster_streams is not None:
            self.cluster_streams.cancel(entry)

    @staticmethod
    def _streamed(entry: Pending) -> int:
        """Bytes handed to the entry's streams: a write below this cancels them."""
        return max((stream.sent for stream in (entry.stream, entry.cluster_stream)
                    if stream is not None), default=0)

    def _touch(self, entry: Pending) -> None:
        """A change restarts the entry's write-back delay: it moves to the back of the order."""
        entry.changed_at = time.monotonic()
        if self._pending.get(entry.slot) is entry:
            self._order.move_to_end(entry.slot)

    def _account(self) -> None:
        """Publish dirty usage: reserve it from the disk tier and update the gauges."""
        self.space.reserve(self.dirty_bytes)
        self.metrics.dirty_bytes.set(self.dirty_bytes)
        self.metrics.upload_queue.set(len(self._pending))

    def _next(self, source: str, key: str, kind: str, **fields: object) -> Pending:
        return Pending(source, key, kind, next(self._seq), **fields)

    def get(self, source: str, key: str) -> Pending | None:
        return self._pending.get((source, key))

    def children(self, source: str, prefix: str) -> list[Pending]:
        """Pending states of keys directly under `prefix`."""
        with self.lock:
            keys = self._by_dir.get((source, prefix), ())
            return [self._pending[(source, key)] for key in keys]

    def has_children(self, source: str, prefix: str) -> bool:
        """Whether any key directly under `prefix` has a pending state (no list made)."""
        return (source, prefix) in self._by_dir

    def child_markers(self, source: str, prefix: str) -> list[Pending]:
        """Pending states of the directory markers directly under `prefix`."""
        with self.lock:
            keys = self._markers_by_dir.get((source, prefix), ())
            return [self._pending[(source, key)] for key in keys]

    def data_path(self, entry: Pending) -> Path | None:
        return self.data_dir / entry.file if entry.file else None

    def hold_file(self, name: str) -> bool:
        """An open handle keeps a data file alive across unlink and rename (POSIX semantics);
        False if the file is gone already (its state settled since it was looked up)."""
        with self.lock:
            if name not in self._file_refs:
                return False
            self._file_refs[name] += 1
            return True

    def drop_file(self, name: str) -> None:
        with self.lock:
            self._release_file(name)

    def info(self, entry: Pending) -> ObjectInfo:
        return ObjectInfo(entry.key, entry.size, f"avafs-local-{entry.seq}-{entry.generation}",
                          entry.mtime, entry.attrs or Attrs())

    @staticmethod
    def _stored(entry: Pending) -> bool:
        return entry.stored_generation == entry.generation

    def close(self) -> None:
        self.journal.close()
