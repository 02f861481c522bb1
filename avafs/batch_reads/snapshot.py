"""The daemon's in-place answers, kept in a file of the cache dir for reader processes to come.

Why: a DataLoader's workers are new processes every epoch unless `persistent_workers=True`, so
their tables of remembered locations (`known_locations.py`) start empty, and every warm sample
would cost a request again although the last epoch's workers were told where it is. A reader
that misses loads this file instead: a fresh worker learns where the whole warm dataset is in
one read of a file in the page cache, not a request per batch.

The file holds only answers that readers may keep: those given under the daemon's current
generation, each with the time it may be kept until (CLOCK_MONOTONIC, shared by the processes
of a machine). Readers check the generation as they do for their own answers. It is rewritten
whole (a new file renamed over the old), at most every `WRITE_EVERY` seconds while answers
come in.
"""

from __future__ import annotations

import logging
import marshal
import os
import threading
import time
from pathlib import Path

from ..reader.known_locations import CLOSED, SNAPSHOT_FORMAT, Location, remember

log = logging.getLogger(__name__)

WRITE_EVERY = 0.2
"""Least seconds between rewrites while new answers come in: a cold epoch of tiny samples asks
for thousands of files a second."""
WRITING_SHARE = 0.05
"""Most of the daemon's time that rewrites may take (one holds the GIL while it marshals
every entry): after a rewrite that took t seconds, the next waits t / WRITING_SHARE."""
MAX_ENTRIES = 100_000
"""About 40 MB of the daemon's memory and a 10 MB file when full; readers ask for the files
beyond it as before."""


class LocationSnapshot:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._partial = path.with_name(path.name + ".partial")
        self._failing = False
        self._lock = threading.Lock()
        self._generation = CLOSED
        self._entries: dict[str, Location] = {}
        self._added = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._write_loop, name="avafs-location-snapshot",
                                        daemon=True)
        self._thread.start()

    def add(self, generation: int, answers: dict[str, tuple[str, int]], until: float) -> None:
        """Answers a reader was allowed to keep until `until` under `generation`; an answer
        of a newer generation drops those of older ones (generations only grow), and one of an
        older generation, late from a request that began before a change, is dropped."""
        with self._lock:
            if generation < self._generation:
                return
            if generation != self._generation:
                self._entries = {}
                self._generation = generation
            remember(self._entries, answers, until, MAX_ENTRIES)
        self._added.set()

    def close(self) -> None:
        self._closing.set()
        self._added.set()
        self._thread.join()
        self._path.unlink(missing_ok=True)
        self._partial.unlink(missing_ok=True)

    def _write_loop(self) -> None:
        while True:
            self._added.wait()
            if self._closing.is_set():
                return
            self._added.clear()
            started = time.monotonic()
            try:
                self._write()
                self._failing = False
            except OSError as error:
                if not self._failing:
                    log.warning("could not write %s (readers will ask for each file until it "
                                "can be written): %s", self._path, error)
                self._failing = True
            spent = time.monotonic() - started
            if self._closing.wait(max(WRITE_EVERY, spent / WRITING_SHARE)):
                return

    def _write(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._entries = {relative: entry for relative, entry in self._entries.items()
                             if entry[2] > now}
            data = marshal.dumps((SNAPSHOT_FORMAT, self._generation, self._entries))
        self._partial.write_bytes(data)
        os.replace(self._partial, self._path)
