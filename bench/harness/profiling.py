"""py-spy profiles of the avafs daemon, one per workload, summarized as top functions.

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
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness.mounts import cpu_seconds

TOP = 15
_ATTACH_SECONDS = 0.5


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
        try:
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
                       f"({100 * cpu / wall:.0f}% of one core)\n"
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
