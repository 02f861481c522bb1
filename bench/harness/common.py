"""Datasets, timed reads and mounts shared by the quickstart and the benchmark."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MiB = 2**20
READ_SIZE = MiB
SET_ASIDE = "set-aside"
"""The workdir's folder of what measurements wrote, deleted when the run ends."""


@dataclass(frozen=True)
class Dataset:
    large: list[str]
    small: list[str]
    large_size: int
    small_size: int

    @property
    def large_bytes(self) -> int:
        return len(self.large) * self.large_size

    @property
    def small_bytes(self) -> int:
        return len(self.small) * self.small_size


def make_dataset(large_files: int, large_size: int, small_files: int,
                 small_size: int) -> Dataset:
    return Dataset([f"large/{i:03d}.bin" for i in range(large_files)],
                   [f"small/{i // 1000:03d}/{i:06d}.bin" for i in range(small_files)],
                   large_size, small_size)


def write_local(root: Path, dataset: Dataset) -> None:
    """Write the dataset under `root` (skipping files already of the right size)."""
    for names, size in ((dataset.large, dataset.large_size), (dataset.small, dataset.small_size)):
        for name in names:
            path = root / name
            if path.exists() and path.stat().st_size == size:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size))


def read_file(path: Path) -> int:
    total = 0
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(READ_SIZE):
            total += len(chunk)
    return total


def read_all(root: Path, names: Iterable[str], threads: int) -> tuple[int, float]:
    """(bytes, seconds) to read every file with `threads` readers, 1 MiB reads."""
    paths = [root / name for name in names]
    started = time.perf_counter()
    if threads == 1:
        total = sum(map(read_file, paths))
    else:
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(read_file, paths))
    return total, time.perf_counter() - started


def avafs(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "avafs", *args], capture_output=True,
                            text=True)
    if check and result.returncode != 0:
        raise SystemExit(f"avafs {args[0]} failed: {result.stderr.strip()}")
    return result


def drop_page_cache(paths: Iterable[Path]) -> None:
    """Drop the kernel's cached pages of these files, so a read really goes to its source."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def set_aside(path: Path, workdir: Path) -> None:
    """Move what a measurement wrote (a cache dir, a tree) out of the way, into the workdir's
    SET_ASIDE folder, to be deleted when the run ends.

    Why not delete it now: on ext4 without a journal (the root file system of the machines
    this was measured on), for a minute or more after a file is deleted, every new file's
    inode allocation steps over the recently freed inodes one by one (`recently_deleted` in
    ext4's allocator). Deleting the local baseline's 10,000 written files made the next
    system measured pay for them: avafs's cold small-file reads create one cache file per
    object, and perf put 19-22% of the daemon's samples in ext4's inode allocation (the same
    reads with the cache on a fresh ext4: 2.1 instead of 3.1 CPU-s per 1000 files). rclone
    pays the same way; the direct download creates no files."""
    if path.exists():
        aside = workdir / SET_ASIDE
        aside.mkdir(exist_ok=True)
        path.rename(aside / f"{path.name}-{uuid.uuid4().hex}")


def used_workdir(workdir: Path | None) -> str | None:
    """Why `workdir` (a --workdir option) cannot hold a new run, or None if it can: a run
    leaves its store's data, caches and journals there, which a second run would find and
    fail on, or replay into its own store."""
    if workdir is not None and workdir.is_dir() and any(workdir.iterdir()):
        return (f"--workdir {workdir} is not empty (a run leaves its store and caches there): "
                "remove it or pass an empty or new directory")
    return None


class PeakWatch:
    """The highest value `measure` returns, sampled every `every` seconds in a thread while
    the `with` block runs (and once as it starts); `peak` holds it."""

    def __init__(self, measure: Callable[[], int], every: float) -> None:
        self.measure = measure
        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="peak-watch")

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.measure())
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> PeakWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
