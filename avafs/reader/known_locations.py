"""Where a reader process last found files' blocks, so a warm batch needs no request at all.

The daemon's in-place answers (`Client.read_files`) may be kept while its generation counter
(a file of the cache dir, mapped here, see `avafs/batch_reads/generation.py`) stays where it
was and for the seconds each answer allows. A repeated epoch of tiny one-file samples then
costs the reader an open and a read per sample, as from local disk, instead of a round trip
through the daemon.

One table per cache dir and process, shared by every Client of that mount in the process (the
adapters make one per epoch); a DataLoader worker keeps it for as long as it lives. A process
that misses takes up the answers the daemon gave other readers
(`avafs/batch_reads/snapshot.py`), so a DataLoader's fresh workers of each epoch start out
knowing what the last epoch's learned.
"""

from __future__ import annotations

import itertools
import marshal
import mmap
import os
import struct
import threading

from ..config.cache_dir import GENERATION_FILE, LOCATIONS_FILE

GENERATION = struct.Struct("<Q")
"""The generation file's one field, written in place by the daemon and mapped by readers."""
CLOSED = 0
"""The generation of a cache dir whose daemon stopped: readers trust no location under it."""

MAX_LOCATIONS = 250_000
"""About 100 MB per process when full; files beyond it are asked for each time, which is what a
dataset that large costs anyway (its epochs outlast the answers' lifetime)."""
SNAPSHOT_FORMAT = 1
"""The first field of the daemon's snapshot file: (format, generation, {path: Location})."""
RELOAD_EVERY = 0.5
"""Seconds a process waits before loading a changed snapshot again: while a cold epoch is
being learned the daemon rewrites it every fraction of a second."""

Location = tuple[str, int, float]
"""A file's block file relative to the cache dir, its size, and the CLOCK_MONOTONIC time until
which the answer may be kept."""


def remember(entries: dict[str, Location], answers: dict[str, tuple[str, int]], until: float,
             cap: int) -> None:
    """Adds answers kept until `until`; past `cap` files, only files already there are
    updated (the reader's table and the daemon's snapshot are bounded alike)."""
    for relative, (path, size) in answers.items():
        if len(entries) < cap or relative in entries:
            entries[relative] = (path, size, until)


class KnownLocations:
    def __init__(self, counter: mmap.mmap, snapshot: str) -> None:
        self._counter = counter
        self._snapshot = snapshot
        self._generation = CLOSED
        self._entries: dict[str, Location] = {}
        self._snapshot_seen: tuple[int, int, int] | None = None
        self.next_load = 0.0
        self.lock = threading.Lock()
        """Keeps a `keep` checked against one generation from writing into the table of the
        next (readers in threads share the table)."""

    def begin(self) -> int:
        """Start a batch: forget everything if the daemon's generation moved. Returns the
        generation the batch's answers must carry to be kept."""
        generation = GENERATION.unpack_from(self._counter)[0]
        with self.lock:
            if generation != self._generation:
                self._entries = {}
                self._generation = generation
                self._snapshot_seen = None
                self.next_load = 0.0
        return generation

    def get(self, relative: str, now: float) -> tuple[str, int] | None:
        """(block file relative to the cache dir, size) of a file, if still to be trusted."""
        found = self._entries.get(relative)
        if found is None or found[2] <= now:
            return None
        return found[0], found[1]

    def keep(self, generation: int, answers: dict[str, tuple[str, int]], keep_for: float,
             now: float) -> None:
        """Keep in-place answers the daemon gave under `generation`, if that is still the one
        in force here (a later `begin` saw no move since)."""
        until = now + keep_for
        with self.lock:
            if generation != self._generation or generation == CLOSED or keep_for <= 0:
                return
            remember(self._entries, answers, until, MAX_LOCATIONS)

    def forget(self, relative: str) -> None:
        self._entries.pop(relative, None)

    def load_snapshot(self, now: float) -> bool:
        """Take up the daemon's snapshot of answers given to any reader, if it changed since
        this process last did; True if it was taken up."""
        if now < self.next_load:
            return False
        try:
            status = os.stat(self._snapshot)
            signature = (status.st_ino, status.st_mtime_ns, status.st_size)
            if signature == self._snapshot_seen:
                return False
            with open(self._snapshot, "rb") as file:
                snapshot_format, generation, entries = marshal.loads(file.read())
        except (OSError, EOFError, ValueError, TypeError):
            return False
        self.next_load = now + RELOAD_EVERY
        with self.lock:
            if snapshot_format != SNAPSHOT_FORMAT or generation != self._generation \
                    or generation == CLOSED:
                return False
            self._snapshot_seen = signature
            merged = {relative: entry for relative, entry in entries.items() if entry[2] > now}
            for relative, entry in self._entries.items():
                theirs = merged.get(relative)
                if theirs is None or theirs[2] < entry[2]:
                    merged[relative] = entry
            if len(merged) > MAX_LOCATIONS:
                merged = dict(itertools.islice(merged.items(), MAX_LOCATIONS))
            self._entries = merged
        return True


_tables: dict[str, KnownLocations | None] = {}
_tables_lock = threading.Lock()


def _reset_in_child() -> None:
    """A DataLoader worker forked while another thread held a lock must not inherit it held,
    and loads a changed snapshot at its first miss, whenever its parent last did."""
    global _tables_lock
    _tables_lock = threading.Lock()
    for table in _tables.values():
        if table is not None:
            table.lock = threading.Lock()
            table.next_load = 0.0


os.register_at_fork(after_in_child=_reset_in_child)


def known_locations(cache_dir: str) -> KnownLocations | None:
    """The process's table for a mount's cache dir; None where the daemon keeps no generation
    (an older daemon) or this process cannot map it."""
    with _tables_lock:
        if cache_dir not in _tables:
            _tables[cache_dir] = _open(cache_dir)
        return _tables[cache_dir]


def _open(cache_dir: str) -> KnownLocations | None:
    try:
        descriptor = os.open(f"{cache_dir}/{GENERATION_FILE}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        counter = mmap.mmap(descriptor, GENERATION.size, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(descriptor)
    return KnownLocations(counter, f"{cache_dir}/{LOCATIONS_FILE}")
