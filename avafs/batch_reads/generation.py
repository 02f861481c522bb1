"""The daemon's side of readers that remember where files' blocks are (`known_locations.py`).

A reader told that a file is in a given block file may read that block file again without
asking, for as long as asking would give the same answer. The answer changes when a pending
write, delete or rename or a settled upload touches a directory the path goes through, or when
a listing the path was resolved with expires. The expiry travels with each answer; changes
move a counter in a file of the cache dir that readers map and check before every batch.

Only changes that can alter such an answer move the counter: a key in the directory of a file
answered in place, or one named like a directory on the way to it. A job writing its logs and
checkpoints beside its dataset does not throw away its readers' locations.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from ..config.cache_dir import GENERATION_FILE
from ..objects import parent_prefix
from ..reader.known_locations import CLOSED, GENERATION


class InPlaceWatch:
    def __init__(self, cache_dir: Path) -> None:
        self._lock = threading.Lock()
        self._directories: set[tuple[str, str]] = set()
        self._on_the_way: set[tuple[str, str]] = set()
        self._changes = 0
        self._descriptor = os.open(cache_dir / GENERATION_FILE,
                                   os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.ftruncate(self._descriptor, GENERATION.size)
        self._map = mmap.mmap(self._descriptor, GENERATION.size)
        # Written in place, never replaced: a reader maps the file once. A value no earlier
        # daemon of this cache dir used, so locations a reader kept from one are dropped.
        self._generation = time.time_ns() | 1
        GENERATION.pack_into(self._map, 0, self._generation)

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def changes(self) -> int:
        """Changes seen in any directory: an answer resolved while this moved may predate one
        in a directory not yet watched, so it is not offered for keeping."""
        return self._changes

    def watch(self, directories: Iterable[tuple[str, str]],
              walked: Iterable[tuple[str, str]]) -> None:
        """(source, prefix) of the directories of files answered in place, and of every
        directory their paths were resolved through."""
        with self._lock:
            self._directories.update(directories)
            self._on_the_way.update((source, prefix[:-1]) for source, prefix in walked if prefix)

    def changed(self, source: str, key: str) -> None:
        """A key appeared, changed or went away (a pending state, a settled upload)."""
        with self._lock:
            self._changes += 1
            if ((source, parent_prefix(key)) in self._directories
                    or (source, key.rstrip("/")) in self._on_the_way) and not self._map.closed:
                self._generation += 1
                GENERATION.pack_into(self._map, 0, self._generation)

    def close(self) -> None:
        """First thing at unmount: readers stop using locations before the daemon stops
        answering for them."""
        with self._lock:
            GENERATION.pack_into(self._map, 0, CLOSED)
            self._map.close()
            os.close(self._descriptor)
