"""The benchmark's verdicts (bench/harness/report.py): what each issue-56 target compares
avafs with, and the whole machine's CPU per unit that stands beside every figure.

The figures are made up and go through the same `Results` the benchmark fills, so what is
pinned down is the arithmetic and the choice of reference, not any timing.
"""

from __future__ import annotations

import pytest

from bench.harness.report import (
    PER_1000_FILES,
    PER_GIB,
    Results,
    cpu_per_unit,
    cpu_verdicts,
    summarize,
)

KIB = 1024
SIZES = {"epoch1_plain": 110 * KIB, "epoch1_map": 110 * KIB, "cold_large": 64 * 2**20,
         "cold_small": 100 * KIB, "remount_large": 64 * 2**20, "remount_small": 100 * KIB}


def test_cpu_per_unit_divides_busy_cores_by_throughput():
    # 2 busy cores at 1,000 files/s of 1 MiB: 2 ms per file, 2 CPU-s per 1,000 files, and
    # 1,000 MiB/s is 1000/1024 GiB/s, so 2.048 CPU-s per GiB.
    files = cpu_per_unit(2.0, 1000, "files/s", 2**20)
    assert files[PER_1000_FILES] == pytest.approx(2.0)
    assert files[PER_GIB] == pytest.approx(2.048)
    # The same throughput given in MB/s (decimal megabytes) gives the same cost.
    large = cpu_per_unit(2.0, 1000 * 2**20 / 1e6, "MB/s", 2**20)
    assert large[PER_GIB] == pytest.approx(2.048)
    assert large[PER_1000_FILES] == pytest.approx(2.0)


def test_cpu_per_unit_has_no_per_gib_for_empty_files_and_nothing_without_cores():
    assert cpu_per_unit(1.0, 500, "entries/s", 0) == {PER_GIB: None, PER_1000_FILES: 2.0}
    assert cpu_per_unit(None, 500, "files/s", KIB) == {PER_GIB: None, PER_1000_FILES: None}


def summary_of(figures: dict[tuple[str, str], tuple[float, float]]) -> dict:
    results = Results()
    for (key, system), (value, cores) in figures.items():
        results.add(key, system, value, machine=cores)
    return summarize(results, 2**30, SIZES)


def test_cold_small_is_judged_against_the_faster_of_juicefs_and_s5cmd():
    summary = summary_of({("cold_small", "avafs"): (900, 1.0),
                          ("cold_small", "juicefs"): (800, 1.0),
                          ("cold_small", "s5cmd"): (1000, 1.0),
                          ("cold_small", "s3fs"): (5000, 1.0)})["cold_small"]
    assert summary["reference_system"] == "s5cmd"
    assert summary["ratio_reference"] == pytest.approx(0.9)
    assert summary["met"] is False
    assert summary["best_peer"] == "s3fs"


def test_the_variants_are_never_the_best_peer():
    summary = summary_of({("remount_small", "avafs"): (1000, 1.0),
                          ("remount_small", "avafs-dataset"): (9000, 1.0),
                          ("remount_small", "rclone-tuned"): (5000, 1.0),
                          ("remount_small", "rclone"): (800, 1.0)})["remount_small"]
    assert summary["reference_system"] == "rclone"
    assert summary["met"] is True
    assert summary["ratio_dataset_flags"] == pytest.approx(9000 / 800)


def test_first_epoch_needs_the_throughput_and_no_more_cpu_per_sample():
    faster_but_dearer = summary_of({("epoch1_plain", "avafs"): (2000, 2.0),
                                    ("epoch1_plain", "s3torch"): (1000, 0.5)})["epoch1_plain"]
    assert faster_but_dearer["ratio_reference"] == pytest.approx(2.0)
    assert faster_but_dearer["met"] is False
    both = summary_of({("epoch1_plain", "avafs"): (2000, 1.0),
                       ("epoch1_plain", "s3torch"): (1000, 1.0)})["epoch1_plain"]
    assert both["met"] is True


def test_cpu_targets_take_the_lowest_peer_cost():
    summary = summary_of({("cold_large", "avafs"): (1000, 1.0),
                          ("cold_large", "s3fs"): (500, 0.4),
                          ("cold_large", "rclone"): (1000, 0.5),
                          ("cold_large", "rclone-tuned"): (1000, 0.1)})
    verdict = next(entry for entry in cpu_verdicts(summary) if entry["workload"] == "cold_large")
    assert verdict["best_peer"] == "rclone"
    assert verdict["reference"] == pytest.approx(0.5 / (1e9 / 2**30))
    assert verdict["met"] is False
