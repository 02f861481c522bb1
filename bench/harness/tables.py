"""The benchmark's summary as Markdown tables (they read well in a terminal too): the figures
with their targets and verdicts, the whole machine's CPU per unit beside them, the serving
processes' CPU seconds, and the CPU targets. Only the systems a run measured get a column."""

from __future__ import annotations

from typing import Any

from bench.harness.report import (
    AVAFS,
    LEGEND,
    PER_1000_FILES,
    PER_GIB,
    SYSTEMS,
    cpu_verdicts,
    number,
)

Summary = dict[str, dict[str, Any]]


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("| " + " | ".join(cell.ljust(width)
                                       for cell, width in zip(row, widths, strict=True)) + " |"
                     for row in rows)


def _measured(entry: dict[str, Any]) -> bool:
    """Whether a workload has a figure or a note (a run can select only some workloads)."""
    return bool(entry["notes"]) or any(value is not None for value in entry["results"].values())


def _systems(summary: Summary) -> list[str]:
    return [system for system in SYSTEMS
            if any(entry["results"][system] is not None for entry in summary.values())]


def _ratio_text(ratio: float | None, who: str | None = None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (f" ({who})" if who else "")


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT MET", None: "n/a"}[met]


def _cell(entry: dict[str, Any], system: str) -> str:
    value = entry["results"][system]
    if value is None and system in entry["notes"]:
        return "n/a*"
    return number(value)


def format_table(summary: Summary) -> str:
    """The figures, their ratios and verdicts, then the notes they refer to and the legend."""
    systems = _systems(summary)
    header = ["workload", "unit", *systems, "avafs/local", "avafs/best peer", "target",
              "ratio", "dataset flags", "status"]
    rows = [header, ["---"] * len(header)]
    notes = []
    for key, entry in summary.items():
        if not _measured(entry):
            continue
        rows.append([entry["title"], entry["unit"],
                     *(_cell(entry, system) for system in systems),
                     _ratio_text(entry["ratio_local"]),
                     _ratio_text(entry["ratio_best_peer"], entry["best_peer"]),
                     entry["target"],
                     _ratio_text(entry["ratio_reference"], entry["reference_system"]),
                     _ratio_text(entry["ratio_dataset_flags"]), _verdict(entry["met"])])
        notes.extend(f"* {key} / {system}: {text}" for system, text in entry["notes"].items())
        notes.extend(f"* {key}: {label}: {number(value)} {entry['unit']}"
                     + (f" (avafs {_ratio_text(entry['results'][AVAFS] / value)} of it)"
                        if entry["results"][AVAFS] else "")
                     for label, value in entry["references"].items())
    legend = [f"* {system}: {text}" for system, text in LEGEND.items() if system in systems]
    return "\n".join([_markdown(rows), *([""] + notes if notes else []),
                      *([""] + legend if legend else [])])


def _per_unit(machine: dict[str, float | None]) -> str:
    if machine[PER_GIB] is None and machine[PER_1000_FILES] is None:
        return "-"
    gib = "-" if machine[PER_GIB] is None else f"{machine[PER_GIB]:.2f}"
    files = "-" if machine[PER_1000_FILES] is None else f"{machine[PER_1000_FILES]:.2f}"
    return f"{gib} / {files}"


def format_machine_table(summary: Summary) -> str:
    """Whole-machine CPU-seconds per GiB / per 1,000 files, each row beside the figure row of
    the table above (per 1,000 files is also milliseconds per file)."""
    systems = _systems(summary)
    header = ["whole-machine CPU-s per GiB / per 1,000 files", *systems]
    rows = [header, ["---"] * len(header)]
    for entry in summary.values():
        cells = [_per_unit(entry["machine_cpu"][system]) for system in systems]
        if any(cell != "-" for cell in cells):
            rows.append([entry["title"], *cells])
    return _markdown(rows)


def format_cpu_table(summary: Summary) -> str:
    """CPU seconds the serving process spent per workload (the mount's daemon; the reader's
    own processes for the clients without one): what each system adds on top of the server."""
    systems = [system for system in _systems(summary) if any(
        entry["cpu_seconds"][system] is not None for entry in summary.values())]
    header = ["CPU seconds (serving process)", *systems]
    rows = [header, ["---"] * len(header)]
    for entry in summary.values():
        cpu = entry["cpu_seconds"]
        if any(cpu[system] is not None for system in systems):
            rows.append([entry["title"], *("-" if cpu[system] is None else f"{cpu[system]:.2f}"
                                           for system in systems)])
    return _markdown(rows)


def format_cpu_verdicts(summary: Summary) -> str:
    """The CPU targets: avafs's whole-machine CPU per unit <= the lowest peer's; empty when
    the run measured none of their workloads."""
    header = ["CPU target", "avafs", "dataset flags", "best peer", "status"]
    rows = [header, ["---"] * len(header)]
    for verdict in cpu_verdicts(summary):
        if verdict["avafs"] is None and verdict["best_peer"] is None:
            continue
        unit = "GiB" if verdict["per"] == PER_GIB else "1,000 files"
        peer = "-" if verdict["best_peer"] is None else \
            f"{verdict['reference']:.2f} ({verdict['best_peer']})"
        rows.append([f"{summary[verdict['workload']]['title']}: CPU-s per {unit}",
                     number(verdict["avafs"]), number(verdict["avafs_dataset_flags"]), peer,
                     _verdict(verdict["met"])])
    return _markdown(rows) if len(rows) > 2 else ""
