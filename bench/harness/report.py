"""What the benchmark measures, its targets, and the summary it reports as JSON.

The targets of the reads and of the first epoch are issue 56's (judged on SeaweedFS, a store
that is not the bottleneck): avafs at its defaults against every peer at theirs, the
fastest client that goes to the store itself (s5cmd, s3torchconnector, a direct download)
and local disk. Warmup and writes keep issue 5's targets, the training workloads issue 23's.
The variants (avafs with its dataset flags, rclone tuned) are shown beside the defaults and
never count as the best peer: the targets are about what a user gets without tuning.

Every figure is the median over rounds of one run, and every ratio divides two figures of that
same run, because on a shared 2-core machine absolute numbers move from run to run while
ratios measured side by side hold. Beside each figure the whole machine's CPU-seconds per GiB
and per 1,000 files (`profiling.MachineCpu`), from the busy cores of each round divided by its
throughput.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.common import MiB, median

AVAFS = "avafs"
AVAFS_DATASET = "avafs-dataset"
LOCAL = "local"
DIRECT = "direct"
S5CMD = "s5cmd"
S3TORCH = "s3torch"
PEERS = ("rclone", "juicefs", "s3fs")
RCLONE_TUNED = "rclone-tuned"
SYSTEMS = (AVAFS, AVAFS_DATASET, LOCAL, DIRECT, S5CMD, S3TORCH, *PEERS, RCLONE_TUNED)
LEGEND = {
    AVAFS_DATASET: "avafs --read-only --listing-attrs (its dataset flags)",
    S5CMD: "s5cmd cp 's3://bench/PREFIX/*' DIR (its defaults)",
    S3TORCH: "s3torchconnector S3MapDataset straight from the store",
    RCLONE_TUNED: "rclone --use-server-modtime --vfs-write-back 0s",
}
"""What the systems that are not a plain tool at its defaults are."""
VARIANTS = (AVAFS_DATASET, RCLONE_TUNED)
"""Tuned mounts: reads only, never the best peer."""
BEST_PEER = "best_peer"
RSS = "rss"
RSS_HEADROOM = 200 * MiB
GIB = 2**30
PER_GIB = "per_gib"
PER_1000_FILES = "per_1000_files"


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    unit: str
    reference: tuple[str, ...]
    """The systems whose best figure the target compares avafs with; BEST_PEER stands for
    the best of PEERS, RSS for the RAM tier size plus RSS_HEADROOM."""
    factor: float
    higher_is_better: bool = True
    cpu_bound: bool = False
    """The target also asks for no more whole-machine CPU per file than the reference's."""


WORKLOADS = (
    Workload("epoch1_plain", "1st epoch, DataLoader over the mount", "samples/s", (S3TORCH,),
             1.0, cpu_bound=True),
    Workload("epoch1_map", "1st epoch, AvaMapDataset", "samples/s", (S3TORCH,), 1.0,
             cpu_bound=True),
    Workload("cold_large", "cold, large files", "MB/s", (DIRECT, S5CMD), 0.9),
    Workload("cold_small", "cold, small files", "files/s", ("juicefs", S5CMD), 1.0),
    Workload("warm_large", "warm, large files", "MB/s", (LOCAL,), 0.6),
    Workload("warm_small", "warm, small files", "files/s", (LOCAL,), 0.5),
    Workload("remount_large", "after remount, large", "MB/s", (BEST_PEER,), 1.0),
    Workload("remount_small", "after remount, small", "files/s", (BEST_PEER,), 1.0),
    Workload("warmup_small", "warmup, small files", "files/s", (DIRECT,), 0.9),
    Workload("write_large", "write large file, durable", "MB/s", (DIRECT,), 0.8),
    Workload("write_small", "write small files, durable", "files/s", (DIRECT,), 0.8),
    Workload("stat_tree", "find/stat, cached entries", "entries/s", (LOCAL,), 0.5),
    Workload("peak_rss", "daemon peak RSS", "MiB", (RSS,), 1.0, higher_is_better=False),
    Workload("ckpt_close", "checkpoint save, until close()", "MB/s", (LOCAL,), 0.8),
    Workload("ckpt_durable", "checkpoint save, until durable", "MB/s", (DIRECT,), 0.8),
    Workload("imagenet_epoch1", "ImageNet tree, 1st epoch", "files/s", (BEST_PEER,), 1.0),
    Workload("imagenet_epoch2", "ImageNet tree, 2nd epoch", "files/s", (LOCAL,), 0.5),
    Workload("map_pod_w2", "AvaMapDataset, pod view, 2 workers", "samples/s", (LOCAL,), 0.8),
    Workload("map_pod_ro_w2", "AvaMapDataset, pod view, read-only, 2 workers", "samples/s",
             (LOCAL,), 0.8),
    Workload("map_host_w2", "AvaMapDataset, host view, 2 workers", "samples/s", (LOCAL,), 0.8),
    Workload("map_pod_w4", "AvaMapDataset, pod view, 4 workers", "samples/s", (LOCAL,), 0.8),
    Workload("map_pod_ro_w4", "AvaMapDataset, pod view, read-only, 4 workers", "samples/s",
             (LOCAL,), 0.8),
    Workload("map_host_w4", "AvaMapDataset, host view, 4 workers", "samples/s", (LOCAL,), 0.8),
    Workload("tf_pod", "tf.data, pod view", "samples/s", (LOCAL,), 0.8),
    Workload("tf_pod_ro", "tf.data, pod view, read-only", "samples/s", (LOCAL,), 0.8),
    Workload("tf_host", "tf.data, host view", "samples/s", (LOCAL,), 0.8),
)
WORKLOAD_KEYS = tuple(workload.key for workload in WORKLOADS)
UNITS = {workload.key: workload.unit for workload in WORKLOADS}


@dataclass(frozen=True)
class CpuTarget:
    """avafs's whole-machine CPU per unit of a workload at most the lowest of the peers'."""

    key: str
    per: str


CPU_TARGETS = (CpuTarget("cold_large", PER_GIB), CpuTarget("cold_small", PER_1000_FILES),
               CpuTarget("remount_large", PER_GIB),
               CpuTarget("remount_small", PER_1000_FILES))


class Results:
    """Per workload and system: the value of every round, and why a value is missing.

    Each figure is also printed to stderr as it is taken, with the wall time since the
    previous one (mounts and setup included), so a slow run shows where its time goes."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[float]]] = self._per_system()
        self.notes: dict[str, dict[str, str]] = {key: {} for key in WORKLOAD_KEYS}
        self.cpu: dict[str, dict[str, list[float]]] = self._per_system()
        self.machine: dict[str, dict[str, list[float | None]]] = self._per_system()
        """Busy cores of the whole machine in each round, aligned with `values`."""
        self.phases: dict[str, dict[str, list[dict[str, float]]]] = self._per_system()
        """Where a write's time went, per round: writing, then the flush until durable."""
        self.references: dict[str, dict[str, list[float]]] = {key: {} for key in WORKLOAD_KEYS}
        """Figures that explain a result without being one of the compared systems."""
        self._last = time.monotonic()

    @staticmethod
    def _per_system() -> dict[str, dict[str, list]]:
        return {key: {system: [] for system in SYSTEMS} for key in WORKLOAD_KEYS}

    def add(self, key: str, system: str, value: float, cpu: float | None = None,
            machine: float | None = None) -> None:
        """One round's figure; `cpu` is the CPU seconds the serving process spent on it (the
        mount's daemon, or this process for the direct transfers), `machine` the busy cores
        of the whole machine while it was measured."""
        self.values[key][system].append(value)
        self.machine[key][system].append(machine)
        if cpu is not None:
            self.cpu[key][system].append(cpu)
        now = time.monotonic()
        spent = f", {cpu:.2f} CPU-s" if cpu is not None else ""
        spent += f", machine {machine:.2f} cores" if machine is not None else ""
        if self.phases[key][system]:
            phase = self.phases[key][system][-1]
            spent += (f"; write {phase['write_seconds']:.1f}s + flush "
                      f"{phase['flush_seconds']:.1f}s")
        print(f"  {system:13} {key:14} {number(value):>9} {UNITS[key]:9} "
              f"(+{now - self._last:.1f}s{spent})", file=sys.stderr, flush=True)
        self._last = now

    def reference(self, key: str, label: str, value: float) -> None:
        self.references[key].setdefault(label, []).append(value)
        print(f"  ({label}: {number(value)} {UNITS[key]})", file=sys.stderr, flush=True)

    def note(self, key: str, system: str, text: str) -> None:
        self.notes[key][system] = text

    def median(self, key: str, system: str) -> float | None:
        values = self.values[key][system]
        return median(values) if values else None


def cpu_per_unit(cores: float | None, value: float, unit: str,
                 file_size: int) -> dict[str, float | None]:
    """Whole-machine CPU-seconds per GiB and per 1,000 files at `value` (a throughput in
    `unit`) with `cores` busy; a unit that does not apply (files of no bytes) is None."""
    if cores is None or not value:
        return {PER_GIB: None, PER_1000_FILES: None}
    if unit == "MB/s":
        bytes_per_s = value * 1e6
        files_per_s = bytes_per_s / file_size if file_size else None
    else:
        files_per_s = value
        bytes_per_s = value * file_size if file_size else None
    return {PER_GIB: cores / (bytes_per_s / GIB) if bytes_per_s else None,
            PER_1000_FILES: cores / (files_per_s / 1000) if files_per_s else None}


def _machine_cpu(results: Results, workload: Workload,
                 file_size: int) -> dict[str, dict[str, float | None]]:
    """Per system, the medians over rounds of the per-unit CPU of each round."""
    summary = {}
    for system in SYSTEMS:
        rounds = [cpu_per_unit(cores, value, workload.unit, file_size) for value, cores in
                  zip(results.values[workload.key][system],
                      results.machine[workload.key][system], strict=True)]
        summary[system] = {per: _median_present(entry[per] for entry in rounds)
                           for per in (PER_GIB, PER_1000_FILES)}
    return summary


def _median_present(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return median(present) if present else None


def _best(values: dict[str, float | None], higher_is_better: bool) -> str | None:
    """The system with the best of `values` (None when none has one)."""
    present = {system: value for system, value in values.items() if value is not None}
    if not present:
        return None
    pick = max if higher_is_better else min
    return pick(present, key=present.__getitem__)


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def evaluate(workload: Workload, medians: dict[str, float | None],
             machine: dict[str, dict[str, float | None]], ram_cache: int) -> dict[str, Any]:
    """The ratios and the verdict of one workload, from its medians."""
    ours = medians[AVAFS]
    best_peer = _best({peer: medians[peer] for peer in PEERS}, workload.higher_is_better)
    if workload.reference == (RSS,):
        reference_system = None
        reference, described = (ram_cache + RSS_HEADROOM) / MiB, "RAM tier + 200 MiB"
    else:
        systems = [best_peer if system == BEST_PEER else system
                   for system in workload.reference]
        reference_system = _best({system: medians[system] for system in systems if system},
                                 workload.higher_is_better)
        reference = medians[reference_system] if reference_system else None
        names = [system.replace("_", " ") for system in workload.reference]
        described = names[0] if len(names) == 1 else f"max({', '.join(names)})"
    ratio = _ratio(ours, reference)
    if workload.higher_is_better:
        met = None if ratio is None else ratio >= workload.factor
        target = f">= {workload.factor:g}x {described}"
    else:
        met = None if ours is None or reference is None else ours <= reference
        target = f"<= {described} ({reference:.0f} MiB)" if reference else described
    if workload.cpu_bound:
        target += ", CPU per file <= its"
        if met is not None and reference_system is not None:
            ours_cpu = machine[AVAFS][PER_1000_FILES]
            theirs = machine[reference_system][PER_1000_FILES]
            met = met and (ours_cpu is None or theirs is None or ours_cpu <= theirs)
    return {
        "ratio_local": _ratio(ours, medians[LOCAL]),
        "best_peer": best_peer,
        "ratio_best_peer": _ratio(ours, medians[best_peer]) if best_peer else None,
        "reference": reference,
        "reference_system": reference_system,
        "ratio_reference": ratio,
        "ratio_dataset_flags": _ratio(medians[AVAFS_DATASET], reference),
        "target": target,
        "met": met,
    }


def summarize(results: Results, ram_cache: int,
              file_sizes: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The JSON "workloads" section: medians, every round, notes, CPU, ratios and verdicts.
    `file_sizes`: the bytes of one file (or sample) of each workload, for the per-unit CPU."""
    summary = {}
    for workload in WORKLOADS:
        medians = {system: results.median(workload.key, system) for system in SYSTEMS}
        machine = _machine_cpu(results, workload, file_sizes.get(workload.key, 0))
        summary[workload.key] = {
            "title": workload.title,
            "unit": workload.unit,
            "higher_is_better": workload.higher_is_better,
            "results": medians,
            "rounds": results.values[workload.key],
            "notes": results.notes[workload.key],
            "cpu_seconds": {system: median(values) if values else None
                            for system, values in results.cpu[workload.key].items()},
            "machine_cpu": machine,
            "phases": {system: phases for system, phases in
                       results.phases[workload.key].items() if phases},
            "references": {label: median(values)
                           for label, values in results.references[workload.key].items()},
            **evaluate(workload, medians, machine, ram_cache),
        }
    return summary


def cpu_verdicts(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The CPU targets: avafs's whole-machine CPU per unit against the lowest peer's."""
    verdicts = []
    for target in CPU_TARGETS:
        machine = summary[target.key]["machine_cpu"]
        peer = _best({peer: machine[peer][target.per] for peer in PEERS}, False)
        ours = machine[AVAFS][target.per]
        theirs = machine[peer][target.per] if peer else None
        verdicts.append({
            "workload": target.key, "per": target.per, "avafs": ours,
            "avafs_dataset_flags": machine[AVAFS_DATASET][target.per],
            "best_peer": peer, "reference": theirs,
            "met": None if ours is None or theirs is None else ours <= theirs})
    return verdicts


def number(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
