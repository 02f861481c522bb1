"""The write-back journal: pending states in rocksdict, written with fsync'ed WAL batches.

A state is journaled after its data file is fsync'ed, and before `close()`/`fsync()` return;
a multi-key change (a directory rename) is one batch, so a crash leaves all of it or none.
After a crash the next mount loads the journal and uploads what it holds.

Group commit: changes are queued in the order they are submitted and one writer thread writes
everything queued as one synced batch, so many files closed at once cost one WAL fsync, not one
each (a synced write also holds the GIL). Removals after an upload are queued without waiting:
lost in a crash, they make the next mount upload the file again, which is idempotent.

Multipart uploads started while files are written (streaming.py) are recorded too, under keys
of their own, so the next mount can abort those a crash left unfinished instead of leaving
their parts in the bucket. Before an upload is started its intent (source, key, time, and the
ids of the uploads of that key the store already had) is written and waited for, and the
record of its id replaces the intent in one batch: a crash between the store creating the
upload and the journal recording its id leaves the intent, by which the next mount finds the
upload in the store.
"""

from __future__ import annotations

import errno
import itertools
import threading
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from .pending import Pending, journal_key

_UPLOAD = b"\x01upload\0"
"""Prefix of the records of multipart uploads in progress (no state key starts with it)."""


_INTENT = b"\x01intent\0"
"""Prefix of the records of multipart uploads about to be started (no state key starts with
it)."""


def _intent_record(source: str, key: str, at: float) -> bytes:
    return _INTENT + f"{source}\0{key}\0{at!r}".encode()


def _intent_fields(record: bytes) -> tuple[str, str, float]:
    source, key, at = record[len(_INTENT):].decode().split("\0")
    return source, key, float(at)


def _records(db: Rdict, prefix: bytes) -> list[bytes]:
    return list(itertools.takewhile(lambda record: record.startswith(prefix),
                                    db.keys(from_key=prefix)))


def _upload_record(source: str, key: str, upload_id: str) -> bytes:
    return _UPLOAD + f"{source}\0{key}\0{upload_id}".encode()


def _upload_fields(record: bytes) -> tuple[str, str, str]:
    source, key, upload_id = record[len(_UPLOAD):].decode().split("\0")
    return source, key, upload_id


class Journal:
    def __init__(self, path: Path) -> None:
        self._db = Rdict(str(path), options=Options(raw_mode=True))
        self._unsynced = WriteOptions()
        self._unsynced.sync = False
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)
        """Wakes the writer thread only."""
        self._written_up_to = threading.Condition(self._lock)
        """Wakes the waiters: one condition for both woke every waiting closer at every
        submit, a herd of thread switches per file closed."""
        self._queue: list[tuple[bytes, bytes | None]] = []
        self._submitted = 0
        self._written = 0
        self._failure: Exception | None = None
        self._closing = False
        self._writer = threading.Thread(target=self._write_batches, daemon=True,
                                        name="avafs-journal")
        self._writer.start()

    def load(self) -> list[Pending]:
        return sorted((Pending.from_record(raw) for key, raw in self._db.items()
                       if not key.startswith((_UPLOAD, _INTENT))), key=lambda entry: entry.seq)

    def load_uploads(self) -> list[tuple[str, str, str]]:
        """(source, key, upload id) of the multipart uploads recorded as open."""
        return [_upload_fields(record) for record in _records(self._db, _UPLOAD)]

    def load_intents(self) -> list[tuple[str, str, float, set[str]]]:
        """(source, key, time.time() of the intent, ids of the uploads of the key the store had
        before) of the uploads that were about to start and whose id was never recorded."""
        return [(*_intent_fields(record), set(filter(None, self._db[record].decode().split("\0"))))
                for record in _records(self._db, _INTENT)]

    def upload_intended(self, source: str, key: str, at: float, before: set[str]) -> None:
        """Record that an upload of `key` is about to start, `before` the ids of its uploads
        the store has already (on disk when this returns)."""
        self.wait(self._enqueue([(_intent_record(source, key, at),
                                  "\0".join(sorted(before)).encode())]))

    def upload_started(self, source: str, key: str, upload_id: str, intended_at: float) -> None:
        """Record an upload in progress in place of its intent (written with the next batch,
        not waited for)."""
        self._enqueue([(_upload_record(source, key, upload_id), b""),
                       (_intent_record(source, key, intended_at), None)])

    def intent_ended(self, source: str, key: str, at: float) -> None:
        self._enqueue([(_intent_record(source, key, at), None)])

    def upload_ended(self, source: str, key: str, upload_id: str) -> None:
        self._enqueue([(_upload_record(source, key, upload_id), None)])

    def submit(self, entries: list[Pending], removed: list[Pending] = ()) -> int:
        """Queue a change (its records are taken now); returns the ticket to wait for."""
        return self._enqueue(
            [(journal_key(entry.source, entry.key), None) for entry in removed]
            + [(journal_key(entry.source, entry.key), entry.record()) for entry in entries])

    def _enqueue(self, operations: list[tuple[bytes, bytes | None]]) -> int:
        """Queue puts (a record) and deletes (None) to be written as one; returns the ticket."""
        with self._lock:
            self._queue.extend(operations)
            self._submitted += 1
            self._queued.notify()
            return self._submitted

    def wait(self, ticket: int) -> None:
        """Until the change with this ticket is on disk; OSError if the journal failed."""
        with self._lock:
            while self._written < ticket:
                if self._failure is not None:
                    raise OSError(errno.EIO, f"write-back journal failed: {self._failure}")
                self._written_up_to.wait()

    def save(self, entries: list[Pending], removed: list[Pending] = ()) -> None:
        self.wait(self.submit(entries, removed))

    def remove(self, entry: Pending) -> None:
        self.submit([], [entry])

    def _write_batches(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._queued.wait()
                if not self._queue:
                    return
                operations, self._queue = self._queue, []
                ticket = self._submitted
            try:
                batch = WriteBatch(raw_mode=True)
                for key, record in operations:
                    if record is None:
                        batch.delete(key)
                    else:
                        batch.put(key, record)
                self._db.write(batch, self._unsynced)
                self._db.flush_wal(True)
            except Exception as error:  # noqa: BLE001 - every waiter gets it
                with self._lock:
                    self._failure = error
                    self._written_up_to.notify_all()
                return
            with self._lock:
                self._written = ticket
                self._written_up_to.notify_all()

    def close(self) -> None:
        """Writes what is queued, then closes."""
        with self._lock:
            self._closing = True
            self._queued.notify()
        self._writer.join()
        self._db.close()
