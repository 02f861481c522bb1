"""One benchmark round: every workload on local disk, the direct boto3 baseline, s5cmd's
copy of the same objects, avafs and the peers (the variants after the defaults they tune),
in that order, each file system through fresh mounts.

A file system's round is three mounts. The first starts with an empty cache dir: cold reads,
then the same files again (warm), then find/stat. The second reuses that cache dir after an
unmount, with the cache files' pages dropped from the kernel, so reads come from the disk
tier. The third starts empty again for the warmup and the writes; a variant has no third.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import s3server
from bench.harness.common import Dataset, MiB, read_all, set_aside, timed
from bench.harness.mounts import AvafsMount, Mount, cpu_seconds, peak_rss
from bench.harness.profiling import MachineCpu, Profiler
from bench.harness.references import S5cmd
from bench.harness.report import AVAFS, DIRECT, LOCAL, S5CMD, VARIANTS, Results
from bench.harness.workloads import (
    SMALL_THREADS,
    WritePlan,
    drop_cached_pages,
    mb_per_s,
    read_large,
    read_small,
    repeated,
    stat_tree,
)

WRITES_UNAVAILABLE = "not available (EROFS): this avafs takes no writes"
PEER_WRITES_SKIPPED = "not measured: add --peer-writes"
OWN_FORMAT = "not measured: stores its own format, so the bucket cannot show the writes durable"
WRITE_KEYS = ("write_large", "write_small")
SERVER_CEILING = "server ceiling: all large files at once, whole-object GETs, 8 threads"
PEER_STAT_ONCE = ("measured in round 1 only: the target compares avafs at its defaults "
                  "with local disk, and a peer's first walk costs one HEAD per file")
VARIANT_READS_ONLY = "not measured: a variant's reads only (the defaults' row has the writes)"


@dataclass
class Setup:
    """What every round shares: the data on local disk and in the bucket."""

    workdir: Path
    local_root: Path
    dataset: Dataset
    tree_entries: int
    plan: WritePlan
    write_source: Path
    client: object
    results: Results
    profiler: Profiler
    peer_writes: bool
    flush_timeout: float
    s5cmd: S5cmd | None
    """The s5cmd reference, None when it is not installed."""

    def cache_dir(self, name: str) -> Path:
        path = self.workdir / "cache" / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    def set_aside(self, path: Path) -> None:
        set_aside(path, self.workdir)


def add_metered(results: Results, key: str, system: str,
                function: Callable[[], float]) -> None:
    """Add the figure `function` returns, with the busy cores of the whole machine while it
    ran (for a system with no serving process of its own: local disk)."""
    with MachineCpu() as machine:
        value = function()
    results.add(key, system, value, machine=machine.cores)


def run_local(setup: Setup, number: int) -> None:
    """Local disk, page cache warm: each set is read once before it is timed."""
    results, dataset, root = setup.results, setup.dataset, setup.local_root
    read_all(root, dataset.large, threads=1)
    add_metered(results, "warm_large", LOCAL,
                lambda: repeated(lambda: read_large(root, dataset)))
    read_all(root, dataset.small, threads=SMALL_THREADS)
    add_metered(results, "warm_small", LOCAL,
                lambda: repeated(lambda: read_small(root, dataset)))
    add_metered(results, "stat_tree", LOCAL, lambda: stat_tree(root / "tree",
                                                               setup.tree_entries))
    target = setup.workdir / "local-writes"
    prefix = f"writes/local-r{number}"
    plan = setup.plan
    add_metered(results, "write_large", LOCAL, lambda: mb_per_s(plan.large_size, plan.write_large(
        target / plan.large_name(prefix), durable=True)))
    add_metered(results, "write_small", LOCAL, lambda: plan.small_count / plan.write_small(
        target, prefix, durable=True))
    setup.set_aside(target)


def timed_with_cpu(function: Callable[[], object]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, busy cores of the whole machine) of a
    direct transfer."""
    cpu_before = time.process_time()
    with MachineCpu() as machine:
        seconds = timed(function)
    return seconds, time.process_time() - cpu_before, machine.cores


def run_direct(setup: Setup, number: int) -> None:
    """boto3 straight to the server, 8 threads: the cold-read and write baselines.

    Large files: boto3's managed download (s3transfer), file after file, as a user copying
    the data to local disk does; the whole-object parallel download, which no sequential
    reader of one file at a time can match, is kept as the server's ceiling for reference."""
    results, dataset, client = setup.results, setup.dataset, setup.client
    seconds, cpu, cores = timed_with_cpu(
        lambda: s3server.download_transfer(client, dataset.large))
    results.add("cold_large", DIRECT, mb_per_s(dataset.large_bytes, seconds), cpu, cores)
    seconds = timed(lambda: s3server.download_objects(client, dataset.large))
    results.reference("cold_large", SERVER_CEILING, mb_per_s(dataset.large_bytes, seconds))
    seconds, cpu, cores = timed_with_cpu(
        lambda: s3server.download_objects(client, dataset.small))
    results.add("cold_small", DIRECT, len(dataset.small) / seconds, cpu, cores)
    prefix = f"writes/direct-r{number}"
    plan = setup.plan
    seconds, cpu, cores = timed_with_cpu(
        lambda: s3server.upload_large(client, plan.large_name(prefix), setup.write_source))
    results.add("write_large", DIRECT, mb_per_s(plan.large_size, seconds), cpu, cores)
    names = plan.small_names(prefix)
    seconds, cpu, cores = timed_with_cpu(
        lambda: s3server.upload_small(client, names, plan.small_payload))
    results.add("write_small", DIRECT, plan.small_count / seconds, cpu, cores)
    s3server.delete_keys(client, list(plan.expected(prefix)))


def run_s5cmd(setup: Setup, number: int) -> None:
    """s5cmd copying the large files, then the small ones, to a new local directory."""
    if setup.s5cmd is None:
        return
    dataset, target = setup.dataset, setup.workdir / f"s5cmd-r{number}"
    for key, prefix, names, size in (("cold_large", "large", dataset.large, dataset.large_size),
                                     ("cold_small", "small", dataset.small, dataset.small_size)):
        if not names:
            continue
        seconds, cpu, cores = setup.s5cmd.copy(prefix, target / prefix, len(names), size)
        value = (mb_per_s(len(names) * size, seconds) if key == "cold_large"
                 else len(names) / seconds)
        setup.results.add(key, S5CMD, value, cpu, cores)
    setup.set_aside(target)


def missing_from_store(setup: Setup, expected: dict[str, int]) -> list[str]:
    """The written keys that are not in the bucket at their size (one listing)."""
    listed = s3server.listed_sizes(setup.client, os.path.commonprefix(list(expected)))
    return [key for key, size in expected.items() if listed.get(key) != size]


def check_durable(setup: Setup, expected: dict[str, int]) -> None:
    """Everything a write workload wrote is in the bucket at its size, checked (untimed)
    after the flush: a flush that returns early would otherwise pass for a fast one."""
    wrong = missing_from_store(setup, expected)
    if wrong:
        raise RuntimeError(f"{len(wrong)} written files are not in the store at their size "
                           f"after the flush, e.g. {wrong[0]}")


class FuseRound:
    """The three mounts of one file system in one round.

    The peers' find/stat is measured in the first round only: its untimed first walk costs
    them one HEAD per file (20,000 on the full tree, over a minute on s3fs), and its target
    compares avafs with local disk, not with the peers."""

    def __init__(self, setup: Setup, mount: Mount, number: int) -> None:
        self.setup = setup
        self.mount = mount
        self.number = number
        self.name = mount.name
        self.rss: list[int] = []

    def _measure(self, key: str, function: Callable[[], float]) -> None:
        pid = self.mount.pid
        with self.setup.profiler.record(f"r{self.number}-{key}", self._profiled_pid()):
            cpu_before = cpu_seconds(pid) if pid else 0.0
            with MachineCpu() as machine:
                value = function()
            cpu = cpu_seconds(pid) - cpu_before if pid else None
        self.setup.results.add(key, self.name, value, cpu, machine.cores)

    def _profiled_pid(self) -> int | None:
        return self.mount.pid if self.name == AVAFS else None

    def _unmount(self) -> None:
        rss = peak_rss(self.mount.pid)
        if rss is not None:
            self.rss.append(rss)
        self.mount.unmount()

    def run(self) -> None:
        cache = self.setup.cache_dir(f"{self.name}-r{self.number}")
        root, dataset = self.mount.mountpoint, self.setup.dataset
        self.mount.mount(cache)
        try:
            self._measure("cold_large", lambda: read_large(root, dataset))
            self._measure("cold_small", lambda: read_small(root, dataset))
            self._measure("warm_large", lambda: repeated(lambda: read_large(root, dataset)))
            self._measure("warm_small", lambda: repeated(lambda: read_small(root, dataset)))
            if self.name == AVAFS or self.number == 1:
                self._measure("stat_tree",
                              lambda: stat_tree(root / "tree", self.setup.tree_entries))
            else:
                self.setup.results.note("stat_tree", self.name, PEER_STAT_ONCE)
        finally:
            self._unmount()
        drop_cached_pages(cache)
        self.mount.mount(cache)
        try:
            self._measure("remount_large", lambda: read_large(root, dataset))
            self._measure("remount_small", lambda: read_small(root, dataset))
        finally:
            self._unmount()
        self.setup.set_aside(cache)
        self._warmup_and_writes()
        if self.rss:
            self.setup.results.add("peak_rss", self.name, max(self.rss) / MiB)

    def _warmup_and_writes(self) -> None:
        if self.name in VARIANTS:
            for key in WRITE_KEYS:
                self.setup.results.note(key, self.name, VARIANT_READS_ONLY)
            return
        is_avafs = isinstance(self.mount, AvafsMount)
        if not is_avafs and not (self.setup.peer_writes and self.mount.writes_in_bucket):
            reason = OWN_FORMAT if self.setup.peer_writes else PEER_WRITES_SKIPPED
            for key in WRITE_KEYS:
                self.setup.results.note(key, self.name, reason)
            return
        cache = self.setup.cache_dir(f"{self.name}-r{self.number}-w")
        self.mount.mount(cache)
        clean = False
        try:
            if is_avafs:
                self._warmup()
            if self.mount.writes_supported():
                clean = self._writes()
            else:
                for key in WRITE_KEYS:
                    self.setup.results.note(key, self.name, WRITES_UNAVAILABLE)
                clean = True
        finally:
            if clean:
                self._unmount()
            else:
                self.mount.abort()
            self.setup.set_aside(cache)
            s3server.delete_keys(self.setup.client,
                                 list(self.setup.plan.expected(self._write_prefix())))

    def _warmup(self) -> None:
        """`avafs warmup` of the small files, through the public Client (no CLI start-up in
        the timing), next to a direct download of the same objects measured just before."""
        from avafs.client import Client

        setup, root = self.setup, self.mount.mountpoint
        seconds, cpu, cores = timed_with_cpu(
            lambda: s3server.download_objects(setup.client, setup.dataset.small))
        setup.results.add("warmup_small", DIRECT, len(setup.dataset.small) / seconds, cpu,
                          cores)
        state: dict = {}

        def warm() -> float:
            started = time.perf_counter()
            state.update(Client(root).warmup([root / "small"], threads=SMALL_THREADS))
            return len(setup.dataset.small) / (time.perf_counter() - started)

        self._measure("warmup_small", warm)
        if state["files_done"] != len(setup.dataset.small) or state["files_failed"]:
            raise RuntimeError(f"warmup loaded {state['files_done']} of "
                               f"{len(setup.dataset.small)} files: {state['failures'][:3]}")

    def _write_prefix(self) -> str:
        return f"writes/{self.name}-r{self.number}"

    def _flush(self, key: str, written: float, expected: dict[str, int]) -> float:
        """Seconds the mount's flush took, after which the files are checked in the store
        (untimed). Both phases are kept: a write path that uploads only after close spends
        the sum of the two, one that uploads while the application writes about the larger."""
        flushed = timed(lambda: self.mount.flush(
            self.setup.flush_timeout, lambda: not missing_from_store(self.setup, expected)))
        check_durable(self.setup, expected)
        self.setup.results.phases[key][self.name].append(
            {"write_seconds": round(written, 3), "flush_seconds": round(flushed, 3)})
        return flushed

    def _writes(self) -> bool:
        """Both write workloads, each timed until the mount's flush returns; False (with the
        reason noted in the results) if one failed, so the mount is aborted, not flushed."""
        plan, root, prefix = self.setup.plan, self.mount.mountpoint, self._write_prefix()

        def large() -> float:
            seconds = plan.write_large(root / plan.large_name(prefix), durable=False)
            flushed = self._flush("write_large", seconds, plan.expected_large(prefix))
            return mb_per_s(plan.large_size, seconds + flushed)

        def small() -> float:
            seconds = plan.write_small(root, prefix, durable=False)
            flushed = self._flush("write_small", seconds, plan.expected_small(prefix))
            return plan.small_count / (seconds + flushed)

        for key, workload in (("write_large", large), ("write_small", small)):
            try:
                self._measure(key, workload)
            except (OSError, RuntimeError) as error:
                self.setup.results.note(key, self.name, f"failed in round {self.number}: "
                                                        f"{error}")
                return False
        return True
