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
in the cluster (cluster_queue.py), holding no lock, completing the staging upload a file
written front to back streamed while it was written (cluster_streams.py); a namespace change
(unlink, rename, mkdir, rmdir, attributes) puts its states' records once it is journaled. A
state that could not be staged stays node-durable and `restage` stages it again later.

Failures: an upload that may succeed later is retried with backoff; one the store refuses for
good (StoreError.permanent) is set aside: kept pending, journaled and on disk, reported by the
status, skipped by the uploaders and by `flush` (which names it), tried again by each `flush`
and by the next mount. A state replaced or removed (the file rewritten, deleted, renamed) is
cancelled: an upload of it in flight stops at its next read of the data file, and the key's
next state waits until it has stopped, so an old upload can never land after a newer change.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from ..errors import ObjectChangedError, StoreError
from ..metrics import Metrics
from ..objects import ObjectRef, allocated, parent_prefix
from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs
from .cluster_queue import ClusterQueue, Record, StagingFailed, token_of
from .cluster_streams import ClusterStreams
from .journal import Journal
from .pending import COPY, DATA, DELETED, Pending
from .streaming import StreamUploads

log = logging.getLogger(__name__)

Settled = Callable[[str, str, ObjectInfo | None], None]
KeepCached = Callable[[str, ObjectInfo, Path], bool]
ReadObject = Callable[[ObjectRef, int, int], bytes]
"""Reads `size` bytes at `offset` of an object version (blocks): how an existing object is
copied in when it is first opened for writing."""
_COPY_IN_CHUNK = 4 * 2**20
_ENOSPC_AFTER = 30.0
"""Seconds the store must have been unreachable, with the disk all dirty data, before writes
fail with ENOSPC instead of waiting for uploads."""


class DirtySpace(Protocol):
    """The local disk space dirty data shares with the disk cache: dirty bytes are reserved
    from it (clean blocks make room for them, never the other way round)."""

    @property
    def capacity(self) -> int: ...

    def reserve(self, dirty_bytes: int) -> None: ...


class WriteBack:
    """The dirty files and pending states of one mount. It knows no tier and no namespace: it
    is handed how to read an object's version (to copy it in) and the disk space it shares
    with the cache, tells who listens through `on_settled` and `on_changed`, and offers the
    files it no longer needs through `keep_cached`."""

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

    # --- recovery ------------------------------------------------------------------------------

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

    # --- state ---------------------------------------------------------------------------------

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
        self._by_dir.setdefault((entry.source, parent_prefix(entry.key)), set()).add(entry.key)
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
        keys = self._by_dir.get((entry.source, parent_prefix(entry.key)))
        if keys is not None:
            keys.discard(entry.key)
            if not keys:
                del self._by_dir[(entry.source, parent_prefix(entry.key))]
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

    # --- writing -------------------------------------------------------------------------------

    def open_writer(self, source: str, key: str, base: ObjectRef | None,
                    truncate: bool, attrs: Attrs | None = None) -> Pending:
        """The DATA state of `key`, made from `base` (its current content) unless truncating,
        with the file's attributes `attrs` (kept by a file already pending).

        Blocks while an existing object is copied in from the tiers.
        """
        with self.lock:
            current = self._pending.get((source, key))
            if current is not None and current.kind == DATA and current.file:
                current.writers += 1
                self._touch(current)
                return current
        name = self._copy_in(None if truncate else base)
        with self.lock:
            entry = self._next(source, key, DATA, file=name,
                               size=0 if truncate or base is None else base.size, attrs=attrs)
            entry.writers = 1
            entry.appended_to = entry.size
            self._index(entry)
            self._account()
            return entry

    def _copy_in(self, base: ObjectRef | None) -> str:
        """A new data file holding `base` (empty for None); blocks while the tiers read it."""
        name = uuid.uuid4().hex
        path = self.data_dir / name
        try:
            with open(path, "wb") as target:
                for offset in range(0, base.size if base is not None else 0, _COPY_IN_CHUNK):
                    target.write(self.read_object(base, offset, _COPY_IN_CHUNK))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return name

    def keep_copy(self, source: str, base: ObjectRef, mtime: float) -> Pending:
        """A local copy of the clean version `base`, which is no key's state and is never
        uploaded, held once for the caller: the open readers of a file that is deleted or
        renamed go on reading it while the store loses that version. Blocks while it is
        copied; dirty space until the last holder lets go."""
        name = self._copy_in(base)
        with self.lock:
            entry = self._next(source, base.key, DATA, file=name, size=base.size, mtime=mtime)
            self._file_refs[name] += 1
            self._charge(entry)
            self._account()
            return entry

    def wrote(self, entry: Pending, start: int, end: int) -> None:
        """Account a write of bytes `start` to `end` (called before the data is written, so an
        upload in flight can tell its snapshot is stale)."""
        with self.lock:
            if start < self._streamed(entry):
                self._stop_streaming(entry)
            entry.generation += 1
            entry.durable = entry.staged_data_current = False
            entry.set_aside = None  # new content: the store gets a new chance
            entry.mtime, entry.mtime_set = time.time(), False
            if entry.attrs is not None and entry.attrs.ctime is not None:
                entry.attrs = replace(entry.attrs, ctime=None)  # the new mtime is the ctime
            self._touch(entry)
            if start > entry.size and entry.allocated is None:
                entry.allocated = allocated(entry.size)  # a hole: `measure` counts the file
            if end > entry.size:
                self._resize(entry, end)
                self._account()

    def appended(self, entry: Pending, start: int, end: int) -> None:
        """Follow a file written front to back once the write from `start` to `end` is in the
        data file: its finished parts can go to the store now."""
        with self.lock:
            if entry.appended_to is None:
                return
            if start > entry.appended_to:
                self._stop_streaming(entry)
                return
            entry.appended_to = max(entry.appended_to, end)
            if self.streams is not None:
                self.streams.grew(entry)
            if self.cluster_streams is not None:
                self.cluster_streams.grew(entry)

    def truncated(self, entry: Pending, size: int) -> None:
        with self.lock:
            if size < self._streamed(entry):
                self._stop_streaming(entry)
            elif entry.appended_to is not None:
                entry.appended_to = min(entry.appended_to, size)
            entry.generation += 1
            entry.durable = entry.staged_data_current = False
            entry.set_aside = None
            entry.mtime, entry.mtime_set = time.time(), False
            if entry.attrs is not None and entry.attrs.ctime is not None:
                entry.attrs = replace(entry.attrs, ctime=None)  # the new mtime is the ctime
            self._touch(entry)
            if size > entry.size and entry.allocated is None:
                entry.allocated = allocated(entry.size)  # a hole: `measure` counts the file
            self._resize(entry, size)
            self._account()

    def over_dirty_limit(self) -> bool:
        """Past the dirty watermark, or past the staging limit (--writeback cluster): uploads
        hurry and writers wait, for either."""
        return self.dirty_bytes > self.dirty_limit or \
            0 < self.staging_limit < self.staged_bytes

    def room_to_write(self) -> bool:
        """Whether a write may go ahead now (asked before each write; never blocks). Past the
        dirty watermark, while some pending change is not held open by a writer (so waiting
        can help), writers wait for uploads instead of failing, and uploads skip the write-back
        delay until the next `flush`: False means ask again shortly. ENOSPC (OSError) only when the disk
        is all dirty data and the store has been unreachable for a while."""
        if not self.over_dirty_limit():
            return True
        with self.lock:
            if all(entry.writers for entry in self._pending.values()):
                return True
            self.eager = True
            unreachable = self.store_unreachable_since
        if self.dirty_bytes >= self.space.capacity and unreachable is not None and \
                time.monotonic() - unreachable > _ENOSPC_AFTER:
            raise OSError(errno.ENOSPC, f"no space: the disk tier holds only dirty data "
                          f"({self.dirty_bytes} bytes) and the store has been unreachable for "
                          f"{time.monotonic() - unreachable:.0f}s")
        return False

    def commit(self, entry: Pending, fd: int | None) -> None:
        """Make the entry's data and state durable locally, and under --writeback cluster in
        the cluster when it answers (close() and fsync() wait for it)."""
        if fd is not None:
            os.fsync(fd)
        staged = self._stage(entry) if self.cluster is not None and self.cluster.available() \
            else None
        with self.lock:
            if staged is not None:
                self._adopt_staged(entry, *staged)
            if self._pending.get(entry.slot) is not entry:
                return
            # Queued under the lock, so the journal keeps the order of changes; waited for
            # outside it, so closes of other files join the same synced batch.
            ticket = self.journal.submit([entry])
            entry.durable = True
            self._touch(entry)
            entry.awaited = self.sync_uploads
            self._wake_uploader()
        self.journal.wait(ticket)
        if self.sync_uploads:
            self.wait_settled([entry])

    def release_writer(self, entry: Pending) -> None:
        with self.lock:
            entry.writers = max(0, entry.writers - 1)
            self._touch(entry)
            closed_as_stored = not entry.writers and self._stored(entry) and \
                self._pending.get(entry.slot) is entry
            if closed_as_stored:
                self._settle(entry, entry.stored_info)
                self.changed.notify_all()
            elif not entry.writers:
                self._wake_uploader()

    def set_attributes(self, source: str, key: str, clean: ObjectInfo | None, mtime: float,
                       attrs: Attrs) -> None:
        """Give `key` a new mtime, mode or owner, durably. A pending change takes them along
        (its upload starts over if one was under way, so the store never keeps the old ones);
        a file the store has (`clean`, attributes read) is copied onto itself with them,
        sending no data; a directory (`clean` None) gets its marker written anew with them."""
        with self.lock:
            current = self._pending.get((source, key))
            if current is not None and current.kind == DELETED:
                raise FileNotFoundError(errno.ENOENT, f"{key} was deleted")
            if current is None:
                changes = [self._next(source, key, DATA, mtime=mtime, attrs=attrs)
                           if clean is None else
                           self._next(source, key, COPY, size=clean.size, mtime=mtime,
                                      attrs=attrs, copy_from=key, copy_etag=clean.etag)]
                self._replace(changes)
            else:
                current.mtime_set = current.mtime_set or mtime != current.mtime
                current.mtime, current.attrs = mtime, attrs
                current.generation += 1
                self._touch(current)
                if not current.durable:
                    return  # its writer's close journals it
                changes = [current]
                ticket = self.journal.submit(changes)
                self._wake_uploader()
        if current is not None:
            self.journal.wait(ticket)
        self._stage_change(changes)

    # --- cluster writes (cluster_queue.py) --------------------------------------------------------

    def enable_cluster(self, queue: ClusterQueue, source_urls: dict[str, str],
                       staging_limit: int = 0) -> None:
        """Stage committed files in the cluster (`source_urls`: each source's URL, which
        the records name so any node can upload them); past `staging_limit` staged bytes
        (0: none) writers wait as past the dirty watermark."""
        self.cluster, self.source_urls = queue, source_urls
        self.staging_limit = staging_limit
        self.cluster_streams = ClusterStreams(self.data_dir, queue, self.lock, self.journal)

    def close_cluster(self) -> None:
        """Abort the staging uploads of files still open, then let the queue's work end."""
        if self.cluster_streams is not None:
            self.cluster_streams.stop()
        if self.cluster is not None:
            self.cluster.close()

    def _record_of(self, entry: Pending) -> Record | None:
        """The record of `entry` as it is now where it needs no data sent: a deletion, a copy,
        a directory marker, a file whose staged object still holds its data (renamed, or
        given new attributes); None for a file whose data must be sent (lock held)."""
        url = self.source_urls[entry.source]
        if entry.kind == DATA and entry.file:
            if entry.staged is None or not entry.staged_data_current:
                return None
            return self.cluster.new_record(
                url, entry.key, entry.size, entry.mtime, entry.attrs,
                staged_object=self.cluster.object_name(self.cluster.node, entry.staged))
        return self.cluster.new_record(url, entry.key, entry.size, entry.mtime, entry.attrs,
                                       entry.kind, entry.copy_from, entry.copy_etag)

    def _stage(self, entry: Pending) -> tuple[str, str, int] | None:
        """Stage the entry as it is now, holding no lock (its data file is held meanwhile);
        (record id, key, generation), or None if it stays node-durable."""
        with self.lock:
            if self._pending.get(entry.slot) is not entry or \
                    entry.staged_generation == entry.generation:
                return None  # gone, or staged as it is (an fsync, then the close)
            key, generation = entry.key, entry.generation
            record = self._record_of(entry)
            if record is None and not self.hold_file(entry.file):
                return None
            name, size, mtime, attrs = entry.file, entry.size, entry.mtime, entry.attrs
        if record is not None:
            try:
                self.cluster.stage(record)
            except StagingFailed:
                return None
            return record.id, key, generation
        try:
            streamed = None if self.cluster_streams is None else \
                self.cluster_streams.complete(entry, generation)
            record = self.cluster.new_record(self.source_urls[entry.source], key, size, mtime,
                                             attrs, staged_object=streamed)
            self.cluster.stage(record, None if streamed else self.data_dir / name)
        except StagingFailed:
            return None
        finally:
            self.drop_file(name)
        return record.id, key, generation

    def _stage_change(self, changes: list[Pending]) -> None:
        """Record the states of one namespace change (unlink, rename, mkdir, ...) in the
        cluster in one transaction, so a take-over replays all of it or none. Where one of
        them needs data sent (a renamed file whose staged object is stale) all wait for
        `restage`, which stages them one by one in order: the new key before the old key's
        deletion."""
        if self.cluster is None or not self.cluster.available():
            return
        with self.lock:
            states = []
            for entry in sorted(changes, key=lambda entry: entry.seq):
                if self._pending.get(entry.slot) is not entry:
                    continue
                record = self._record_of(entry)
                if record is None:
                    return
                states.append((entry, record, entry.key, entry.generation))
        if not states:
            return
        try:
            self.cluster.stage_all([record for _, record, _, _ in states])
        except StagingFailed:
            return
        self._journal_staged([(entry, record.id, key, generation)
                              for entry, record, key, generation in states])

    def _journal_staged(self, states: list[tuple[Pending, str, str, int]]) -> None:
        """Adopt staged records (entry, record id, key, generation) and journal the entries
        that keep them."""
        with self.lock:
            adopted = [entry for entry, *staged in states
                       if self._adopt_staged(entry, *staged) and entry.durable]
            if not adopted:
                return
            ticket = self.journal.submit(adopted)
        self.journal.wait(ticket)

    def _adopt_staged(self, entry: Pending, record: str, key: str, generation: int) -> bool:
        """Make `record` the entry's record unless the entry went, moved to another key, or
        has a newer one; the record left over is dropped, its object too unless the kept
        record names it (call with the lock held)."""
        newer = entry.staged_generation is not None and entry.staged_generation > generation
        current = entry.staged
        shared = current is not None and token_of(current) == token_of(record)
        if self._pending.get(entry.slot) is not entry or entry.key != key or newer:
            self.cluster.drop(record, keep_object=shared)
            return False
        if current is not None:
            self.cluster.drop(current, keep_object=shared)
        size = entry.size if entry.kind == DATA and entry.file else 0
        self.staged_bytes += size - entry.staged_bytes
        entry.staged, entry.staged_generation, entry.staged_bytes = record, generation, size
        entry.staged_data_current = generation == entry.generation
        return True

    def _unstage(self, entry: Pending) -> None:
        """The entry is no longer its key's state: its record goes (in the background)."""
        if entry.staged is not None and self.cluster is not None:
            self.cluster.drop(entry.staged)
        self.staged_bytes -= entry.staged_bytes
        entry.staged = entry.staged_generation = None
        entry.staged_bytes = 0

    def unstaged(self) -> list[Pending]:
        """Committed states not staged as they are now (only node-durable), in change order."""
        with self.lock:
            return sorted((entry for entry in self._pending.values()
                           if entry.durable and entry.staged_generation != entry.generation),
                          key=lambda entry: entry.seq)

    def pending_keys(self) -> set[tuple[str, str]]:
        """(source, key) of every pending state: newer here than any record of it that no
        pending state names."""
        with self.lock:
            return {(entry.source, entry.key) for entry in self._pending.values()}

    def staged_ids(self) -> set[str]:
        with self.lock:
            return {entry.staged for entry in self._pending.values() if entry.staged}

    def restage(self) -> int:
        """Stage every committed state that is only node-durable (a failed stage, a rename,
        a change of attributes), oldest change first; how many were staged. Stops at the
        first failure: the cluster is not answering. With nothing to stage after a failure,
        probes the cluster instead, so that commits stage again once it answers."""
        unstaged = self.unstaged()
        if not unstaged and self.cluster.failing_since is not None:
            self.cluster.probe()
        staged_count = 0
        for entry in unstaged:
            staged = self._stage(entry)
            if staged is None:
                break
            self._journal_staged([(entry, *staged)])
            staged_count += 1
        return staged_count

    @staticmethod
    def _stored(entry: Pending) -> bool:
        return entry.stored_generation == entry.generation

    # --- namespace changes ---------------------------------------------------------------------

    def _replace(self, changes: list[Pending], removed: list[Pending] = ()) -> None:
        """Journal and index several states at once (one synced batch)."""
        if not changes and not removed:
            return  # an empty batch would never be written, and its wait never end
        self.journal.save(changes, [entry for entry in removed])
        for entry in removed:
            self._unindex(entry)
        for entry in changes:
            entry.durable = True
            self._index(entry)
        self._account()
        self.changed.notify_all()
        self._wake_uploader(len(changes))
        if self.sync_uploads:
            self.lock.release()
            try:
                self.wait_settled(changes)
            finally:
                self.lock.acquire()

    def unlink(self, source: str, key: str) -> None:
        with self.lock:
            changes = [self._next(source, key, DELETED)]
            self._replace(changes)
        self._stage_change(changes)

    def make_empty(self, source: str, key: str, attrs: Attrs | None = None) -> None:
        """A directory marker (`key` ends in '/') or a special file (`attrs.file_type`): an
        object whose metadata is all it holds, journaled before this returns."""
        with self.lock:
            changes = [self._next(source, key, DATA, attrs=attrs)]
            self._replace(changes)
        self._stage_change(changes)

    def rmdir(self, source: str, prefix: str) -> None:
        """The marker goes after every pending change below it (a local bucket cannot remove
        a directory that still holds files)."""
        with self.lock:
            below = tuple(key for (entry_source, key) in self._pending
                          if entry_source == source and key.startswith(prefix) and key != prefix)
            changes = [self._next(source, prefix, DELETED, wait_for=below)]
            self._replace(changes)
        self._stage_change(changes)

    def rename(self, source: str, moves: list[tuple[str, str]], markers: list[tuple[str, str]],
               clean_info: Callable[[str], ObjectInfo | None], renamed: str) -> None:
        """Move keys (old, new) and directory markers (old prefix, new prefix) in one journal
        batch, so a crash leaves the whole rename or none of it. A key with no pending state
        is clean: `clean_info` gives its store info, asked under the lock, as an upload may
        have settled since the caller listed it (for a marker: what is known of it, or None).
        The entry renamed itself (`renamed`, its old key or prefix) gets a new ctime where its
        attributes are known; what moves with a directory keeps its own.

        Written data moves as the same state under its new key, so the handles open on it
        (which hold that state) go on writing what the new key shows and uploads; a new
        generation stops an upload of it to the old key from settling it."""
        with self.lock:
            changes: list[Pending] = []
            removed: list[Pending] = []
            rekeyed: list[tuple[Pending, str, int, Attrs | None]] = []
            changed_at = time.time()
            for old, new in moves:
                current = self._pending.get((source, old))
                if current is not None and current.kind == DATA:
                    rekeyed.append((current, current.key, current.seq, current.attrs))
                    current.key, current.seq = new, next(self._seq)
                    if old == renamed:
                        current.attrs = replace(current.attrs or Attrs(), ctime=changed_at)
                    current.generation += 1
                    # Indexing it under `new` first keeps its file: the deletion that takes
                    # its old key's place releases only the old key's hold.
                    changes += [current, self._next(source, old, DELETED)]
                elif current is not None and current.kind == COPY and \
                        current.copy_from == new:
                    # Renamed back before its copy landed: the store still has the version
                    # (nothing changes a key a copy reads), so the key needs no change.
                    if (source, new) in self._pending:
                        removed.append(self._pending[(source, new)])
                    changes.append(self._next(source, old, DELETED))
                elif current is not None and current.kind == COPY:
                    # A change of attributes copies `old` onto itself: the copy to `new` reads it.
                    changes += [self._next(source, new, COPY, size=current.size,
                                           mtime=current.mtime, copy_from=current.copy_from,
                                           copy_etag=current.copy_etag, attrs=current.attrs),
                                self._next(source, old, DELETED, wait_for=(
                                    (new,) if current.copy_from == old else ()))]
                elif current is None and (clean := clean_info(old)) is not None:
                    attrs = clean.attrs
                    if attrs is not None and old == renamed:
                        attrs = replace(attrs, ctime=changed_at)
                    changes += [self._next(source, new, COPY, size=clean.size, mtime=clean.mtime,
                                           copy_from=old, copy_etag=clean.etag, attrs=attrs),
                                self._next(source, old, DELETED, wait_for=(new,))]
            for old, new in sorted(markers, key=lambda marker: -marker[0].count("/")):
                below = tuple(entry.key for entry in changes
                              if entry.key.startswith(old) and entry.key != old)
                current = self._pending.get((source, old))
                marker = self.info(current) if current is not None and current.kind == DATA \
                    else clean_info(old)
                attrs = None if marker is None else marker.attrs
                if attrs is not None and old == renamed:
                    attrs = replace(attrs, ctime=changed_at)
                changes += [self._next(source, new, DATA, mtime=marker.mtime if marker else
                                       changed_at, attrs=attrs),
                            self._next(source, old, DELETED, wait_for=below)]
            try:
                self._replace(changes, removed)
            except BaseException:  # not journaled: the moved states keep their old keys
                for entry, key, seq, attrs in rekeyed:
                    entry.key, entry.seq, entry.attrs = key, seq, attrs
                raise
        self._stage_change(changes)

    # --- upload bookkeeping, for the uploader ----------------------------------------------------

    def _hurried(self) -> bool:
        """Whether uploads skip the write-back delay."""
        return self.eager or self.sync_uploads or self.over_dirty_limit()

    def _wake_uploader(self, keys: int = 1) -> None:
        """An idle uploader for each key that may be uploadable now (call with the lock
        held). Inside the write-back delay none is: the uploaders' polling finds it when due."""
        if self._hurried():
            self.work.notify(keys)

    def next_ready(self, now: float) -> Pending | None:
        """The entry the uploader should start now, if any, marked as uploading.

        Entries are visited least recently changed first, so the scan stops at the first one
        still inside its write-back delay: every later one is too. The cost is the number of
        entries skipped for other reasons (open, backing off, waiting for another key), not
        the number pending, which matters with tens of thousands of small files queued."""
        hurry = self._hurried()
        if not self.may_upload():
            return None
        with self.lock:
            for slot in self._order:
                entry = self._pending[slot]
                if not hurry and not entry.awaited and now - entry.changed_at < self.delay:
                    return None
                if entry.uploading or not entry.durable or entry.next_attempt > now or \
                        (entry.writers and not entry.awaited) or self._stored(entry) or \
                        entry.set_aside is not None:
                    continue
                if any((entry.source, other) in self._pending for other in entry.wait_for) or \
                        self._read_by_other_copies(entry) or slot in self._in_flight:
                    continue  # e.g. a new file of a name renamed away, before its copy lands
                entry.uploading, entry.upload_slot = True, slot
                self._in_flight[slot] += 1
                return entry
            return None

    def _upload_ended(self, entry: Pending) -> None:
        """The uploader is done with `entry` (call with the lock held); a state of its key
        that waited for it may go now."""
        entry.uploading = False
        slot, entry.upload_slot = entry.upload_slot, None
        if slot is not None:
            self._in_flight[slot] -= 1
            if self._in_flight[slot] <= 0:
                del self._in_flight[slot]
                if slot in self._pending:
                    self._wake_uploader()

    def settled(self, entry: Pending, generation: int, info: ObjectInfo | None) -> bool:
        """Record that the store has `entry` as of `generation`; False if it changed since."""
        with self.lock:
            self._upload_ended(entry)
            self.store_unreachable_since = None
            current = self._pending.get(entry.slot)
            if current is not entry or entry.generation != generation:
                self.changed.notify_all()
                return False
            if entry.writers:
                entry.stored_generation, entry.stored_info = generation, info
                self.changed.notify_all()
                return True
            self._settle(entry, info)
            self.changed.notify_all()
        return True

    def _settle(self, entry: Pending, info: ObjectInfo | None) -> None:
        """The store has the entry's state: the namespace learns `info` before the state goes,
        so no lookup in between finds neither (a file written in a directory whose listing
        is not cached would show its size from before its writes)."""
        self.on_settled(entry.source, entry.key, info)
        self.journal.remove(entry)
        kept = entry.kind == DATA and info is not None and info.size == entry.size
        self._unindex(entry, info if kept else None)
        self._account()

    def failed(self, entry: Pending, error: Exception) -> None:
        """An upload of `entry` failed: retried later, set aside if the store refused it for
        good, forgotten if the entry was cancelled meanwhile."""
        with self.lock:
            self._upload_ended(entry)
            if entry.cancelled:
                self.changed.notify_all()
                log.info("upload of %r stopped: the file changed or went away", entry.key)
                return
            entry.attempts += 1
            entry.next_attempt = time.monotonic() + min(0.5 * 2 ** min(entry.attempts, 7), 30.0)
            self.metrics.upload_failures.inc()
            if isinstance(error, StoreError) and error.permanent:
                entry.set_aside = str(error)
            elif isinstance(error, ObjectChangedError) and entry.kind == COPY:
                log.error("cannot finish renaming %r to %r: %s; the source was changed by "
                          "someone else", entry.copy_from, entry.key, error)
                self.journal.remove(entry)
                self._unindex(entry)
                self._account()
            elif self.store_unreachable_since is None:
                self.store_unreachable_since = time.monotonic()
            self.changed.notify_all()
        if entry.set_aside is not None:
            path = self.data_path(entry)
            log.error("upload of %r refused by the store: %s; set aside, kept locally%s: "
                      "'avafs flush' tries it again", entry.key, error,
                      f" in {path}" if path is not None else "")
            return
        log.warning("upload of %r (attempt %d) failed: %s; retrying in %.1fs", entry.key,
                    entry.attempts, error, entry.next_attempt - time.monotonic())

    def set_aside(self) -> list[Pending]:
        """The pending states the store refused for good, oldest change first."""
        with self.lock:
            return [self._pending[slot] for slot in self._order
                    if self._pending[slot].set_aside is not None]

    # --- flush and status --------------------------------------------------------------------

    def wait_settled(self, entries: list[Pending], timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while any(self._pending.get(entry.slot) is entry and not self._stored(entry)
                      for entry in entries):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self.changed.wait(remaining if remaining is not None else 1.0)
        return True

    def flush(self, progress: Callable[[dict], None] | None = None,
              selects: Callable[[Pending], bool] | None = None,
              timeout: float | None = None) -> dict:
        """Upload everything now (everything `selects` picks, if given) and wait until nothing
        is pending but what the store refuses for good, or `timeout` seconds; the status of what
        is still pending is returned. Each set-aside state gets one more attempt (the cause may
        have been fixed, e.g. a bucket policy), and the result's `set_aside` names those refused
        again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.eager = True
        try:
            with self.lock:
                for entry in self._pending.values():
                    if entry.set_aside is not None:
                        entry.set_aside, entry.next_attempt = None, 0.0
                self.work.notify_all()
                while self._waiting_for_flush(selects):
                    remaining = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                    if remaining <= 0:
                        break
                    if progress is not None:
                        progress(self.status(selects))
                    self.changed.wait(remaining)
        finally:
            self.eager = False
        return self.status(selects)

    def _waiting_for_flush(self, selects: Callable[[Pending], bool] | None) -> bool:
        """Whether some pending state (of those `selects` picks) can still reach the store: it
        is not set aside and does not wait for a key whose state is."""
        refused = {entry.slot for entry in self._pending.values() if entry.set_aside is not None}
        return any(entry.set_aside is None and (selects is None or selects(entry))
                   and not any((entry.source, other) in refused for other in entry.wait_for)
                   for entry in self._pending.values())

    def status(self, selects: Callable[[Pending], bool] | None = None) -> dict[str, Any]:
        """Dirty bytes and pending changes, of those `selects` picks if given."""
        with self.lock:
            if selects is None:
                pending = list(self._pending.values())
                dirty, files = self.dirty_bytes, len(self._file_dirty)
            else:
                pending = [entry for entry in self._pending.values() if selects(entry)]
                held = {entry.file for entry in pending if entry.file in self._file_dirty}
                dirty, files = sum(self._file_dirty[name] for name in held), len(held)
            return {"bytes": dirty,
                    "files": files,
                    "upload_queue": len(pending),
                    "uploading": sum(entry.uploading for entry in pending),
                    "set_aside": [{"source": entry.source, "key": entry.key,
                                   "error": entry.set_aside} for entry in pending
                                  if entry.set_aside is not None]}

    def close(self) -> None:
        self.journal.close()
