"""Which pending state is uploaded next, and what becomes of it; a part of WriteBack
(manager.py), whose uploaders (uploader.py) ask `next_ready` and report `settled` or `failed`.

Order: least recently changed first. A state is uploadable once it is committed (durable),
its writers closed it (unless a close waits for it, under --writeback sync), and the
write-back delay passed since its last change (no delay past the dirty watermark, under
--writeback sync or during a flush), after the states it waits for (`wait_for`: a rename's
delete waits for its copy; any new state of a key waits for the copies reading it) and once no
other upload of its key is in flight. Copies that wait for each other (files swapped by
renames) are ended by copying one source in as data (`_copies_in_a_cycle`).

Failures: an upload that may succeed later is retried with exponential backoff (one second,
doubling, at most 30 s) for as long as the daemon runs, and stays in the journal across
restarts; one the store refuses for good (StoreError.permanent) is set aside: kept pending,
journaled and on disk, reported by the status, skipped by the uploaders and by `flush` (which
names it), tried again by each `flush` and by the next mount. A state replaced or removed (the
file rewritten, deleted, renamed) is cancelled: an upload of it in flight stops at its next
read of the data file, and the key's next state waits until it has stopped, so an old upload
can never land after a newer change.
"""

from __future__ import annotations

import logging
import time

from ..errors import ObjectChangedError, StoreError
from ..stores.base import ObjectInfo
from .pending import COPY, DATA, DELETED, Pending

log = logging.getLogger(__name__)


class RenameSourceChanged(ObjectChangedError):
    """A rename's copy found its source's version gone from the store: another writer
    replaced or deleted it. `source_now` is what the store holds under the source's key now
    (None: nothing), which stays there: the rename's deletion of that key is dropped."""

    def __init__(self, message: str, source_now: ObjectInfo | None) -> None:
        super().__init__(message)
        self.source_now = source_now


class UploadOrder:
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
                        slot in self._in_flight:
                    continue  # e.g. a rename's deletion, before its copy lands
                entry.copy_in = False
                if self._read_by_other_copies(entry):
                    if not self._copies_in_a_cycle(entry):
                        continue  # e.g. a new file of a name renamed away, before its copy lands
                    entry.copy_in = True
                entry.uploading, entry.upload_slot = True, slot
                self._in_flight[slot] += 1
                return entry
            return None

    def _copies_in_a_cycle(self, entry: Pending) -> bool:
        """Whether `entry`, a state that copies read, is a copy that reads, through the keys
        other pending copies read, its own key: files the store has swapped by renames (a to
        t, b to a, t to b), where each copy waits for the other and none would ever go. The
        walk follows one key per step, as each key has one state (call with the lock held)."""
        if entry.kind != COPY or entry.copy_from == entry.key:
            return False  # a change of attributes waits for the copies reading its version
        seen = {entry.key}
        key = entry.copy_from
        while key not in seen:
            seen.add(key)
            other = self._pending.get((entry.source, key))
            if other is None or other.kind != COPY or other.copy_from == other.key:
                return False
            key = other.copy_from
        return key == entry.key

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
        good, forgotten if the entry was cancelled meanwhile. A rename whose source version
        another writer replaced or deleted is forgotten with the deletion of its source,
        which would otherwise delete what that writer put there."""
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
                log.error("cannot finish renaming %r to %r: %s; another writer changed or "
                          "deleted the source, which is left as it is", entry.copy_from,
                          entry.key, error)
                self.journal.remove(entry)
                self._unindex(entry)
                self._account()
                deletion = self._pending.get((entry.source, entry.copy_from))
                if isinstance(error, RenameSourceChanged) and deletion is not None and \
                        deletion.kind == DELETED and entry.key in deletion.wait_for:
                    self._settle(deletion, error.source_now)
                self.changed.notify_all()
                return
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
