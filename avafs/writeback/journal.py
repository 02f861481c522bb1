"""The write-back journal: pending states in rocksdict, written with fsync'ed WAL batches.

A state is journaled after its data file is fsync'ed, and before `close()`/`fsync()` return;
a multi-key change (a directory rename) is one batch, so a crash leaves all of it or none.
After a crash the next mount loads the journal and uploads what it holds.
"""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from .pending import Pending, journal_key


class Journal:
    def __init__(self, path: Path) -> None:
        self._db = Rdict(str(path), options=Options(raw_mode=True))
        self._synced = WriteOptions()
        self._synced.sync = True

    def load(self) -> list[Pending]:
        return sorted((Pending.from_record(raw) for raw in self._db.values()),
                      key=lambda entry: entry.seq)

    def save(self, entries: list[Pending], removed: list[Pending] = ()) -> None:
        batch = WriteBatch(raw_mode=True)
        for entry in removed:
            batch.delete(journal_key(entry.source, entry.key))
        for entry in entries:
            batch.put(journal_key(entry.source, entry.key), entry.record())
        self._db.write(batch, self._synced)

    def remove(self, entry: Pending) -> None:
        self.save([], [entry])

    def close(self) -> None:
        self._db.close()
