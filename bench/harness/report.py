"""What the benchmark measures, its targets, and the table and JSON it reports.

The read targets are those of issue 23 (judged on SeaweedFS, a store that is not the
bottleneck); warmup and writes keep those of issue 5. The training workloads (checkpoint
save, the ImageNet-shaped tree, the adapters in a host's and a pod's view) are issue 23's
item 3.

Every figure is the median over rounds of one run, and every ratio divides two figures of that
same run, because on a shared 2-core machine absolute numbers move from run to run while
ratios measured side by side hold.
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
LOCAL = "local"
DIRECT = "direct"
PEERS = ("rclone", "juicefs", "s3fs")
SYSTEMS = (AVAFS, LOCAL, DIRECT, *PEERS)
RSS_HEADROOM = 200 * MiB


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    unit: str
    reference: str
    """What the target compares avafs with: local, direct, best_peer, cold (the faster of
    direct and the best peer) or rss (the RAM tier size plus RSS_HEADROOM)."""
    factor: float
    higher_is_better: bool = True


WORKLOADS = (
    Workload("cold_large", "cold, large files", "MB/s", "cold", 1.0),
    Workload("cold_small", "cold, small files", "files/s", "cold", 1.0),
    Workload("warm_large", "warm, large files", "MB/s", LOCAL, 0.6),
    Workload("warm_small", "warm, small files", "files/s", LOCAL, 0.5),
    Workload("remount_large", "after remount, large", "MB/s", "best_peer", 1.0),
    Workload("remount_small", "after remount, small", "files/s", "best_peer", 1.0),
    Workload("warmup_small", "warmup, small files", "files/s", DIRECT, 0.9),
    Workload("write_large", "write large file, durable", "MB/s", DIRECT, 0.8),
    Workload("write_small", "write small files, durable", "files/s", DIRECT, 0.8),
    Workload("stat_tree", "find/stat, cached entries", "entries/s", LOCAL, 0.5),
    Workload("peak_rss", "daemon peak RSS", "MiB", "rss", 1.0, higher_is_better=False),
    Workload("ckpt_close", "checkpoint save, until close()", "MB/s", LOCAL, 0.8),
    Workload("ckpt_durable", "checkpoint save, until durable", "MB/s", DIRECT, 0.8),
    Workload("imagenet_epoch1", "ImageNet tree, 1st epoch", "files/s", "best_peer", 1.0),
    Workload("imagenet_epoch2", "ImageNet tree, 2nd epoch", "files/s", LOCAL, 0.5),
    Workload("map_pod_w2", "AvaMapDataset, pod view, 2 workers", "samples/s", LOCAL, 0.8),
    Workload("map_pod_ro_w2", "AvaMapDataset, pod view, read-only, 2 workers", "samples/s",
             LOCAL, 0.8),
    Workload("map_host_w2", "AvaMapDataset, host view, 2 workers", "samples/s", LOCAL, 0.8),
    Workload("map_pod_w4", "AvaMapDataset, pod view, 4 workers", "samples/s", LOCAL, 0.8),
    Workload("map_pod_ro_w4", "AvaMapDataset, pod view, read-only, 4 workers", "samples/s",
             LOCAL, 0.8),
    Workload("map_host_w4", "AvaMapDataset, host view, 4 workers", "samples/s", LOCAL, 0.8),
    Workload("tf_pod", "tf.data, pod view", "samples/s", LOCAL, 0.8),
    Workload("tf_pod_ro", "tf.data, pod view, read-only", "samples/s", LOCAL, 0.8),
    Workload("tf_host", "tf.data, host view", "samples/s", LOCAL, 0.8),
)
WORKLOAD_KEYS = tuple(workload.key for workload in WORKLOADS)
UNITS = {workload.key: workload.unit for workload in WORKLOADS}


class Results:
    """Per workload and system: the value of every round, and why a value is missing.

    Each figure is also printed to stderr as it is taken, with the wall time since the
    previous one (mounts and setup included), so a slow run shows where its time goes."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[float]]] = {
            key: {system: [] for system in SYSTEMS} for key in WORKLOAD_KEYS}
        self.notes: dict[str, dict[str, str]] = {key: {} for key in WORKLOAD_KEYS}
        self.cpu: dict[str, dict[str, list[float]]] = {
            key: {system: [] for system in SYSTEMS} for key in WORKLOAD_KEYS}
        self.phases: dict[str, dict[str, list[dict[str, float]]]] = {
            key: {system: [] for system in SYSTEMS} for key in WORKLOAD_KEYS}
        """Where a write's time went, per round: writing, then the flush until durable."""
        self.references: dict[str, dict[str, list[float]]] = {key: {} for key in WORKLOAD_KEYS}
        """Figures that explain a result without being one of the compared systems."""
        self._last = time.monotonic()

    def add(self, key: str, system: str, value: float, cpu: float | None = None) -> None:
        """One round's figure; `cpu` is the CPU seconds the serving process spent on it (the
        mount's daemon, or this process for the direct transfers)."""
        self.values[key][system].append(value)
        if cpu is not None:
            self.cpu[key][system].append(cpu)
        now = time.monotonic()
        spent = f", {cpu:.2f} CPU-s" if cpu is not None else ""
        if self.phases[key][system]:
            phase = self.phases[key][system][-1]
            spent += (f"; write {phase['write_seconds']:.1f}s + flush "
                      f"{phase['flush_seconds']:.1f}s")
        print(f"  {system:6} {key:14} {_number(value):>9} {UNITS[key]:9} "
              f"(+{now - self._last:.1f}s{spent})", file=sys.stderr, flush=True)
        self._last = now

    def reference(self, key: str, label: str, value: float) -> None:
        self.references[key].setdefault(label, []).append(value)
        print(f"  ({label}: {_number(value)} {UNITS[key]})", file=sys.stderr, flush=True)

    def note(self, key: str, system: str, text: str) -> None:
        self.notes[key][system] = text

    def median(self, key: str, system: str) -> float | None:
        values = self.values[key][system]
        return median(values) if values else None


def _best(values: Iterable[float | None], higher_is_better: bool) -> float | None:
    present = [value for value in values if value is not None]
    if not present:
        return None
    return max(present) if higher_is_better else min(present)


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def evaluate(workload: Workload, medians: dict[str, float | None],
             ram_cache: int) -> dict[str, Any]:
    """The ratios and the verdict of one workload, from its medians."""
    ours = medians[AVAFS]
    best_peer_name = None
    peer_values = {peer: medians[peer] for peer in PEERS if medians[peer] is not None}
    if peer_values:
        pick = max if workload.higher_is_better else min
        best_peer_name = pick(peer_values, key=peer_values.__getitem__)
    best_peer = peer_values.get(best_peer_name) if best_peer_name else None
    if workload.reference == "rss":
        reference, described = (ram_cache + RSS_HEADROOM) / MiB, "RAM tier + 200 MiB"
    elif workload.reference == "cold":
        reference = _best([medians[DIRECT], best_peer], True)
        described = "max(direct, best peer)"
    elif workload.reference == "best_peer":
        reference, described = best_peer, "best peer"
    else:
        reference, described = medians[workload.reference], workload.reference
    if workload.higher_is_better:
        ratio = _ratio(ours, reference)
        met = None if ratio is None else ratio >= workload.factor
        target = f">= {workload.factor:g}x {described}"
    else:
        ratio = _ratio(ours, reference)
        met = None if ours is None or reference is None else ours <= reference
        target = f"<= {described} ({reference:.0f} MiB)" if reference else described
    return {
        "ratio_local": _ratio(ours, medians[LOCAL]),
        "best_peer": best_peer_name,
        "ratio_best_peer": _ratio(ours, best_peer),
        "reference": reference,
        "ratio_reference": ratio,
        "target": target,
        "met": met,
    }


def summarize(results: Results, ram_cache: int) -> dict[str, dict[str, Any]]:
    """The JSON "workloads" section: medians, every round, notes, ratios and verdicts."""
    summary = {}
    for workload in WORKLOADS:
        medians = {system: results.median(workload.key, system) for system in SYSTEMS}
        summary[workload.key] = {
            "title": workload.title,
            "unit": workload.unit,
            "higher_is_better": workload.higher_is_better,
            "results": medians,
            "rounds": results.values[workload.key],
            "notes": results.notes[workload.key],
            "cpu_seconds": {system: median(values) if values else None
                            for system, values in results.cpu[workload.key].items()},
            "phases": {system: phases for system, phases in
                       results.phases[workload.key].items() if phases},
            "references": {label: median(values)
                           for label, values in results.references[workload.key].items()},
            **evaluate(workload, medians, ram_cache),
        }
    return summary


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _cell(entry: dict[str, Any], system: str) -> str:
    value = entry["results"][system]
    if value is None and system in entry["notes"]:
        return "n/a*"
    return _number(value)


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT MET", None: "n/a"}[met]


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    """A Markdown table (it reads well in a terminal too), then the notes it refers to."""
    header = ["workload", "unit", *SYSTEMS, "avafs/local", "avafs/best peer", "target",
              "ratio", "status"]
    rows = [header, ["---"] * len(header)]
    notes = []
    for key, entry in summary.items():
        if not _measured(entry):
            continue
        rows.append([entry["title"], entry["unit"],
                     *(_cell(entry, system) for system in SYSTEMS),
                     _ratio_text(entry["ratio_local"]),
                     _ratio_text(entry["ratio_best_peer"], entry["best_peer"]),
                     entry["target"], _ratio_text(entry["ratio_reference"]),
                     _verdict(entry["met"])])
        notes.extend(f"* {key} / {system}: {text}" for system, text in entry["notes"].items())
        notes.extend(f"* {key}: {label}: {_number(value)} {entry['unit']}"
                     + (f" (avafs {_ratio_text(entry['results'][AVAFS] / value)} of it)"
                        if entry["results"][AVAFS] else "")
                     for label, value in entry["references"].items())
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             + " |" for row in rows]
    return "\n".join(lines + ([""] + notes if notes else []))


def _measured(entry: dict[str, Any]) -> bool:
    """Whether a workload has a figure or a note (a run can select only some workloads)."""
    return bool(entry["notes"]) or any(value is not None for value in entry["results"].values())


def format_cpu_table(summary: dict[str, dict[str, Any]]) -> str:
    """CPU seconds the serving process spent per workload: what each system adds on top of
    the server, on a machine where the server and the client share two cores."""
    systems = [AVAFS, DIRECT, *PEERS]
    header = ["CPU seconds (serving process)", *systems]
    rows = [header, ["---"] * len(header)]
    for entry in summary.values():
        cpu = entry["cpu_seconds"]
        if any(cpu[system] is not None for system in systems):
            rows.append([entry["title"], *(_cpu(cpu[system]) for system in systems)])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return "\n".join("| " + " | ".join(cell.ljust(width)
                                       for cell, width in zip(row, widths, strict=True)) + " |"
                     for row in rows)


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio_text(ratio: float | None, who: str | None = None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (f" ({who})" if who else "")


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
