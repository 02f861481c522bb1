"""The benchmark's smoke mode, as CI runs it: a real store (SeaweedFS, the default, with every
peer, both references and every workload; moto with no peer and the workloads that go to the
store: the adapters' readers time warm reads, which no store serves, and each of their runs
starts TensorFlow or torch anew), real mounts, tiny data.

No timing is asserted (timing targets live in bench/, as ratios); the test checks that the
command runs end to end on each store, reports every workload it selected (the first epoch
and the training ones included: checkpoint save, the ImageNet-shaped tree, the adapters in a
host's and a pod's view) with sane numbers, the CPU seconds of every mount's serving process
and the whole machine's CPU per unit beside every figure (and nothing for the ones it did not
select), and leaves no mount behind.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRITES = ("write_large", "write_small")
# Workload -> the systems that must have a figure in every run (peers are optional).
REQUIRED = {
    "epoch1_plain": ("avafs", "avafs-dataset"),
    "epoch1_map": ("avafs", "avafs-dataset"),
    "cold_large": ("avafs", "avafs-dataset", "direct", "s5cmd"),
    "cold_small": ("avafs", "avafs-dataset", "direct", "s5cmd"),
    "warm_large": ("avafs", "avafs-dataset", "local"),
    "warm_small": ("avafs", "avafs-dataset", "local"),
    "remount_large": ("avafs", "avafs-dataset"),
    "remount_small": ("avafs", "avafs-dataset"),
    "warmup_small": ("avafs", "direct"),
    "write_large": ("avafs", "local", "direct"),
    "write_small": ("avafs", "local", "direct"),
    "stat_tree": ("avafs", "local"),
    "peak_rss": ("avafs",),
    "ckpt_close": ("avafs", "local"),
    "ckpt_durable": ("avafs", "direct"),
    "imagenet_epoch1": ("avafs",),
    "imagenet_epoch2": ("avafs", "local"),
    "map_pod_w2": ("avafs", "local"),
    "map_pod_ro_w2": ("avafs", "local"),
    "map_host_w2": ("avafs", "local"),
    "map_pod_w4": ("avafs", "local"),
    "map_pod_ro_w4": ("avafs", "local"),
    "map_host_w4": ("avafs", "local"),
    "tf_pod": ("avafs", "local"),
    "tf_pod_ro": ("avafs", "local"),
    "tf_host": ("avafs", "local"),
}
READER_FIGURES = ("map_", "tf_", "epoch1_")
"""How the figures of the workloads that start torch or TensorFlow begin: the adapters'
readers (`adapters`, `tf`) and the first epoch (`epoch`)."""
PEER_WORKLOADS = ("cold_large", "epoch1_plain", "imagenet_epoch1", "imagenet_epoch2")
"""Workloads every peer runs, so each must have a figure and its CPU seconds."""
VARIANTS = {"rclone": "rclone-tuned"}
"""The tuned variant a peer brings, measured in the reads and the first epoch only."""
VARIANT_WORKLOADS = ("cold_large", "epoch1_plain")
NO_MACHINE_CPU = ("peak_rss",)
"""Figures that are not a throughput, so have no CPU per unit."""


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [line.split()[4] for line in mountinfo if line.split()[4].startswith(str(path))]


@pytest.mark.parametrize(("store", "peers", "readers", "version"), [
    ("seaweedfs", ("rclone", "juicefs", "s3fs"), True, "SeaweedFS 4.48"),
    ("moto", (), False, "moto "),
])
def test_smoke_run_reports_every_workload(tmp_path, store, peers, readers, version):
    report, workdir = tmp_path / "bench.json", tmp_path / "work"
    selected = "core,checkpoint,imagenet" + (",epoch,adapters,tf" if readers else "")
    result = subprocess.run(
        [sys.executable, "-m", "bench.benchmark", "--smoke", "--json", str(report),
         "--workdir", str(workdir), "--store", store, "--peers", ",".join(peers),
         "--workloads", selected],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "| cold, large files" in result.stdout
    assert mounts_under(workdir) == []

    document = json.loads(report.read_text())
    assert document["smoke"] is True
    assert document["store"] == store
    assert document["versions"]["store"].startswith(version)
    assert document["machine"]["cpus"] >= 1
    workloads = document["workloads"]
    assert set(workloads) == set(REQUIRED)
    required = {key: systems for key, systems in REQUIRED.items()
                if readers or not key.startswith(READER_FIGURES)}
    for key in set(REQUIRED) - set(required):
        assert set(workloads[key]["results"].values()) == {None}, f"{key} ran unselected"
    for key, systems in required.items():
        entry = workloads[key]
        for system, value in entry["results"].items():
            assert value is None or (math.isfinite(value) and value > 0), (key, system, value)
        for system in systems:
            if key in WRITES and system == "avafs" and entry["results"]["avafs"] is None:
                assert "avafs" in entry["notes"], f"{key}: no avafs figure and no reason"
                continue
            assert entry["results"][system] is not None, (key, system, entry["notes"])
            assert len(entry["rounds"][system]) == 1, (key, system)
        assert entry["target"]
        assert entry["met"] in (True, False, None)
    for key in PEER_WORKLOADS:
        if key not in required:
            continue
        variants = [VARIANTS[peer] for peer in peers
                    if peer in VARIANTS and key in VARIANT_WORKLOADS]
        for system in ("avafs", *peers, *variants):
            assert workloads[key]["results"][system] is not None, (key, system)
            cpu = workloads[key]["cpu_seconds"][system]
            assert cpu is not None and cpu >= 0, (key, system, cpu)
    if readers:
        for key in ("epoch1_plain", "epoch1_map"):
            assert workloads[key]["results"]["s3torch"] is not None, key
            assert workloads[key]["reference_system"] == "s3torch", key
    for key in set(required) - set(NO_MACHINE_CPU):
        for system, value in workloads[key]["results"].items():
            if value is not None:
                per_unit = workloads[key]["machine_cpu"][system]["per_1000_files"]
                assert per_unit is not None and per_unit >= 0, (key, system, per_unit)
    assert {verdict["workload"] for verdict in document["cpu_targets"]} == {
        "cold_large", "cold_small", "remount_large", "remount_small"}
    for system in ("avafs", *peers):
        assert workloads["peak_rss"]["results"][system] > 0, system
    for key in required:
        if key != "peak_rss":
            assert workloads[key]["cpu_seconds"]["avafs"] is not None, \
                f"{key}: no daemon CPU seconds"


def test_unknown_workload_is_refused():
    result = subprocess.run(
        [sys.executable, "-m", "bench.benchmark", "--workloads", "core,bogus"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2
    assert "--workloads: unknown bogus; use some of core,epoch,checkpoint,imagenet,adapters,tf" \
        in result.stderr


def test_used_workdir_is_refused(tmp_path):
    """A run's workdir keeps its store's data; a second run there would fail half-way."""
    (tmp_path / "seaweedfs").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "bench.benchmark", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2
    assert f"--workdir {tmp_path} is not empty" in result.stderr
