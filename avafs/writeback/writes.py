"""Writing files: the DATA state of a key opened for writing, its data file made from the object
(copied in once), the bookkeeping of each write and truncate, back-pressure past the dirty
watermark, commits (close and fsync) and changes of attributes; a part of WriteBack
(manager.py), whose `lock` guards everything here."""

from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from dataclasses import replace

from ..objects import ObjectRef, allocated
from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs
from .pending import COPY, DATA, DELETED, Pending

log = logging.getLogger(__name__)

_COPY_IN_CHUNK = 4 * 2**20
_ENOSPC_AFTER = 30.0
"""Seconds the store must have been unreachable, with the disk all dirty data, before writes
fail with ENOSPC instead of waiting for uploads."""


class FileWrites:
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

    def copy_in_source(self, entry: Pending, generation: int, base: ObjectRef, mtime: float,
                       attrs: Attrs) -> None:
        """Make the copy `entry` (as of `generation`) a DATA state holding its source's
        version `base`, read now, with `mtime` and `attrs`: the source's own state then no
        longer waits for it, which ends a cycle of copies (`UploadOrder.next_ready` asks for
        this). Blocks while the tiers read it; journaled before it returns. Left as it was if
        the state changed meanwhile."""
        name = self._copy_in(base)
        with self.lock:
            if self._pending.get(entry.slot) is not entry or entry.generation != generation \
                    or entry.kind != COPY:
                (self.data_dir / name).unlink(missing_ok=True)
                return
            self._count_copy(entry, -1)
            entry.kind, entry.file, entry.copy_from, entry.copy_etag = DATA, name, None, None
            entry.copy_in, entry.mtime, entry.attrs = False, mtime, attrs
            entry.generation += 1
            entry.staged_data_current = False
            self._file_refs[name] += 1
            self._charge(entry)
            self._account()
            ticket = self.journal.submit([entry])
            self._wake_uploader(2)
        self.journal.wait(ticket)

    def wrote(self, entry: Pending, start: int, end: int) -> None:
        """Account a write of bytes `start` to `end` (called before the data is written, so an
        upload in flight can tell its snapshot is stale)."""
        with self.lock:
            if start < self._streamed(entry):
                self._stop_streaming(entry)
            self._new_content(entry)
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
            self._new_content(entry)
            if size > entry.size and entry.allocated is None:
                entry.allocated = allocated(entry.size)  # a hole: `measure` counts the file
            self._resize(entry, size)
            self._account()

    def _new_content(self, entry: Pending) -> None:
        """The data file changed (call with the lock held): a new generation, so an upload
        of the old one cannot settle it; not durable until committed; a new chance with the
        store for a state it had refused; the time of the change as mtime and ctime."""
        entry.generation += 1
        entry.durable = entry.staged_data_current = False
        entry.set_aside = None
        entry.mtime, entry.mtime_set = time.time(), False
        if entry.attrs is not None and entry.attrs.ctime is not None:
            entry.attrs = replace(entry.attrs, ctime=None)  # the new mtime is the ctime
        self._touch(entry)

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
