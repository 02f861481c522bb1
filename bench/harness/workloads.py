"""The timed operations of the benchmark, each run the same way on every system.

Reads reuse `common.read_all` (1 MiB reads; large files one reader, small files eight).
Writes are timed until the data is durable: fsync on local disk, the store's answer for the
direct upload, and for a mount the write, the close and then the mount's own flush.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.harness.common import Dataset, MiB, median, read_all

SMALL_THREADS = 8
REPEATS = 5
REPEAT_BUDGET = 1.0
"""Warm reads and find/stat can take tens of milliseconds, too short to time once on a
shared machine: they are repeated (up to REPEATS times, while under REPEAT_BUDGET seconds in
all) and the median of the repeats is the round's figure. Slow systems get one repetition."""
TREE_FANOUT = 1000
TREE_ENTRIES = 20_000
"""The find/stat tree's size in a full run (`benchmark.py --tree`, `probes.py walk`)."""
_PATTERN_SIZE = 64 * MiB


def mb_per_s(size: int, seconds: float) -> float:
    return size / seconds / 1e6


def read_large(root: Path, dataset: Dataset) -> float:
    """MB/s of one reader reading every large file once."""
    size, seconds = read_all(root, dataset.large, threads=1)
    if size != dataset.large_bytes:
        raise RuntimeError(f"read {size} bytes of large files under {root}, expected "
                           f"{dataset.large_bytes}")
    return mb_per_s(size, seconds)


def read_small(root: Path, dataset: Dataset) -> float:
    """Files/s of eight readers reading every small file once."""
    size, seconds = read_all(root, dataset.small, threads=SMALL_THREADS)
    if size != dataset.small_bytes:
        raise RuntimeError(f"read {size} bytes of small files under {root}, expected "
                           f"{dataset.small_bytes}")
    return len(dataset.small) / seconds


def tree_names(entries: int) -> list[str]:
    """The find/stat tree: `entries` empty files in directories of TREE_FANOUT."""
    return [f"tree/{i // TREE_FANOUT:03d}/{i:06d}" for i in range(entries)]


def write_tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()


def walk_and_stat(root: Path) -> int:
    """What `find -type f` plus a stat of each file does: the number of files seen."""
    count = 0
    for directory, _, files in os.walk(root):
        for name in files:
            os.stat(os.path.join(directory, name))
            count += 1
    return count


def repeated(measure: Callable[[], float]) -> float:
    """The median of repeated measurements of something already warm (see REPEATS)."""
    values: list[float] = []
    started = time.perf_counter()
    while not values or (len(values) < REPEATS
                         and time.perf_counter() - started < REPEAT_BUDGET):
        values.append(measure())
    return median(values)


def stat_tree(root: Path, entries: int) -> float:
    """Entries/s of a walk that stats every file, after one untimed walk fills the caches
    ("cached entries"); the median of REPEATS walks."""
    seen = walk_and_stat(root)
    if seen != entries:
        raise RuntimeError(f"found {seen} files under {root}, expected {entries}")

    def walk() -> float:
        started = time.perf_counter()
        walk_and_stat(root)
        return entries / (time.perf_counter() - started)

    return repeated(walk)


def drop_cached_pages(directory: Path) -> None:
    """Write back and drop the page cache of every file under `directory` (a cache dir), so
    a read after remount comes from the disk, not from pages the first mount left.

    fdatasync first: POSIX_FADV_DONTNEED leaves dirty pages in memory."""
    for folder, _, files in os.walk(directory):
        for name in files:
            try:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                with contextlib.suppress(OSError):
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@dataclass(frozen=True)
class WritePlan:
    """What the write workloads write: one large file, and many small ones."""

    large_size: int
    small_count: int
    small_size: int
    pattern: bytes
    """Random bytes the large file repeats (generating 1 GiB of randomness would be slower
    than the writes it feeds)."""

    @classmethod
    def make(cls, large_size: int, small_count: int, small_size: int) -> WritePlan:
        return cls(large_size, small_count, small_size,
                   os.urandom(min(_PATTERN_SIZE, max(large_size, small_size))))

    @property
    def small_payload(self) -> bytes:
        return self.pattern[:self.small_size]

    def small_names(self, prefix: str) -> list[str]:
        return [f"{prefix}/small/{i // TREE_FANOUT:03d}/{i:06d}.bin"
                for i in range(self.small_count)]

    def large_name(self, prefix: str) -> str:
        return f"{prefix}/large.bin"

    def expected_large(self, prefix: str) -> dict[str, int]:
        """Key -> size of what the large write leaves under `prefix` in the store."""
        return {self.large_name(prefix): self.large_size}

    def expected_small(self, prefix: str) -> dict[str, int]:
        return {name: self.small_size for name in self.small_names(prefix)}

    def expected(self, prefix: str) -> dict[str, int]:
        """Key -> size of everything a write round leaves under `prefix` in the store."""
        return self.expected_small(prefix) | self.expected_large(prefix)

    def write_source(self, path: Path) -> None:
        """The large file on local disk, the direct upload's source."""
        with open(path, "wb") as file:
            for start in range(0, self.large_size, MiB):
                file.write(self._chunk(start))

    def _chunk(self, start: int) -> memoryview:
        offset = start % len(self.pattern)
        end = min(offset + MiB, len(self.pattern), offset + self.large_size - start)
        return memoryview(self.pattern)[offset:end]

    def write_large(self, path: Path, durable: bool) -> float:
        """Seconds to write the large file sequentially in 1 MiB writes (and fsync it when
        `durable`)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with open(path, "wb", buffering=0) as file:
            position = 0
            while position < self.large_size:
                position += file.write(self._chunk(position))
            if durable:
                os.fsync(file.fileno())
        return time.perf_counter() - started

    def write_small(self, root: Path, prefix: str, durable: bool) -> float:
        """Seconds to write every small file with SMALL_THREADS writers (directories are
        made first, untimed)."""
        names = self.small_names(prefix)
        for folder in sorted({(root / name).parent for name in names}):
            folder.mkdir(parents=True, exist_ok=True)
        payload = self.small_payload

        def write(name: str) -> None:
            with open(root / name, "wb", buffering=0) as file:
                file.write(payload)
                if durable:
                    os.fsync(file.fileno())

        return timed_parallel(write, names, SMALL_THREADS)


def timed_parallel(function: Callable[[str], object], items: list[str], threads: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(function, items))
    return time.perf_counter() - started
