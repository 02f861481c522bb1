"""What a workload costs in CPU: the whole machine's busy time over its interval, and py-spy
profiles of the avafs daemon, one per workload, summarized as top functions.

`MachineCpu` reads /proc/stat around a measurement: user (niced time included, as the run
may be started under `nice`), system, irq and softirq, summed over every core. It counts what
the serving process, the reader, the store and the kernel spent together, which is what a
user's node pays; it also counts whatever else runs on the machine, so it is only meaningful
on a machine the benchmark has to itself. The figure kept is busy cores (CPU-seconds per wall
second): divided by a throughput, it gives CPU-seconds per file or per GiB.

With `--profile DIR` the benchmark samples the daemon while each avafs workload runs and
writes py-spy's raw (collapsed) stacks plus a summary: the functions that were running
themselves (self) and those whose callees were (inclusive), and the CPU seconds the daemon
used against the workload's wall time. Only samples holding the GIL are kept (`--gil`): the
daemon is Python, so what holds the GIL is what bounds it, while threads blocked on sockets
or conditions would otherwise fill the profile. Sampling slows the daemon, so a profiled
run's timings are for finding hot paths, not for the results.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from bench.harness.mounts import cpu_seconds

TOP = 15
_ATTACH_SECONDS = 0.5
_BUSY_FIELDS = (0, 1, 2, 5, 6)
"""/proc/stat's `cpu` line: user, nice, system, idle, iowait, irq, softirq, steal, ...; guest
time is already inside user."""


def machine_busy_seconds() -> float:
    """CPU-seconds every core of the machine has spent busy since boot (see _BUSY_FIELDS)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return sum(int(fields[index]) for index in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


class MachineCpu:
    """The whole machine's busy CPU-seconds and the wall seconds of a `with` block."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.wall = 0.0

    def __enter__(self) -> MachineCpu:
        self._busy = machine_busy_seconds()
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.wall = time.perf_counter() - self._started
        self.seconds = machine_busy_seconds() - self._busy

    @property
    def cores(self) -> float:
        """Busy cores on average over the block."""
        return self.seconds / self.wall if self.wall else 0.0


class Profiler:
    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.summaries: dict[str, str] = {}
        if directory is not None:
            if shutil.which("py-spy") is None:
                raise SystemExit("--profile needs py-spy: pip install py-spy")
            directory.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def record(self, label: str, pid: int | None) -> Iterator[None]:
        """Sample `pid` while the body runs (no-op without --profile)."""
        if self.directory is None or pid is None:
            yield
            return
        raw = self.directory / f"{label}.txt"
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw",
                                "--function", "--gil", "--rate", "200", "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(_ATTACH_SECONDS)
        cpu_before, started = cpu_seconds(pid), time.monotonic()
        machine = MachineCpu()
        try:
            with machine:
                yield
        finally:
            cpu = cpu_seconds(pid) - cpu_before
            wall = time.monotonic() - started
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
        if raw.exists():
            summary = (f"{label}: daemon CPU {cpu:.2f}s in {wall:.2f}s wall "
                       f"({100 * cpu / wall:.0f}% of one core), whole machine "
                       f"{machine.seconds:.2f} CPU-s (py-spy's own included)\n"
                       + summarize_collapsed(raw.read_text(), label))
            (self.directory / f"{label}-summary.txt").write_text(summary)
            self.summaries[label] = summary


def _parse(text: str) -> list[tuple[list[str], int]]:
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def summarize_collapsed(text: str, label: str) -> str:
    """Top self and inclusive functions of a collapsed-stack profile, in percent of samples."""
    stacks = _parse(text)
    total = sum(count for _, count in stacks)
    if not total:
        return f"{label}: no samples\n"
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"  {total} samples holding the GIL", "  self:"]
    lines += [f"    {100 * count / total:5.1f}%  {frame}" for frame, count in own.most_common(TOP)]
    lines.append("  inclusive:")
    lines += [f"    {100 * count / total:5.1f}%  {frame}"
              for frame, count in inclusive.most_common(TOP)]
    return "\n".join(lines) + "\n"
