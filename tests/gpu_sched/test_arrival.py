"""The arrival experiment on small synthetic traces in both column layouts, with known outcomes."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_sched.arrival import (
    ARRIVAL_POLICIES,
    BinpackArrival,
    Cluster,
    FgdArrival,
    arrival_order,
    make_arrival_policy,
    pod_shape,
    run_arrival,
)
from gpu_sched.fragmentation import PodTypes, Shape
from gpu_sched.trace import POD_COLUMNS, TraceNode, read_nodes, read_pods

SHORT_COLUMNS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def write_trace(tmp_path: Path, nodes: list[str], pods: list[str], short: bool = False
                ) -> tuple[list[TraceNode], list[Any]]:
    """Nodes as `sn,cpu,mem,gpu,model` rows; pods as `name,cpu,mem,num_gpu,gpu_milli[,spec]`."""
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(nodes)
                                        + "\n")
    if short:
        text = SHORT_COLUMNS + "\n" + "\n".join(pods) + "\n"
    else:
        rows = []
        for pod in pods:
            cells = pod.split(",")
            spec = cells[5] if len(cells) > 5 else ""
            rows.append(",".join([*cells[:5], spec, "LS", "Running", "0", "", "0"]))
        text = ",".join(POD_COLUMNS) + "\n" + "\n".join(rows) + "\n"
    (tmp_path / "pods.csv").write_text(text)
    return read_nodes(tmp_path / "nodes.csv"), read_pods(tmp_path / "pods.csv")


@pytest.mark.parametrize("short", [False, True])
@pytest.mark.parametrize("policy", ARRIVAL_POLICIES)
def test_cpu_and_memory_limit_what_the_gpus_can_take(tmp_path: Path, policy: str,
                                                     short: bool) -> None:
    """8 one-GPU pods arrive (100% demand) on a node with CPU for 2 and one with memory for 3."""
    nodes, pods = write_trace(tmp_path, ["cpu-poor,8000,1000000,8,V100M32",
                                         "mem-poor,96000,30000,8,V100M32"],
                              ["p,4000,10000,1,1000"], short)
    report = run_arrival(nodes, pods, policy, demand=1.0, seed=3)
    assert report["pods_arrived"] == 16
    assert report["failed"] == 11
    assert report["allocation_at_demand"] == pytest.approx(5 / 16)
    assert report["unallocated_gpus"] == 11


@pytest.mark.parametrize("policy", ARRIVAL_POLICIES)
def test_gpu_model_and_sharing_are_honoured(tmp_path: Path, policy: str) -> None:
    """600-shares, one per GPU; each pod accepts one model, and each model has two GPUs."""
    nodes, pods = write_trace(tmp_path, ["t4,96000,1000000,2,T4", "v100,96000,1000000,2,V100M32"],
                              ["t4-only,1000,1000,1,600,T4", "v100-only,1000,1000,1,600,V100M32"])
    report = run_arrival(nodes, pods, policy, demand=1.0, seed=0)
    names = arrival_order_names(nodes, pods, 1.0, 0)
    placed = min(2, names.count("t4-only")) + min(2, names.count("v100-only"))
    assert report["pods_arrived"] == len(names) == 6
    assert report["failed"] == 6 - placed
    assert report["unallocated_gpus"] == pytest.approx(4 - placed * 0.6)


@pytest.mark.parametrize("short", [False, True])
@pytest.mark.parametrize("policy", ARRIVAL_POLICIES)
def test_a_multi_gpu_pod_takes_all_its_gpus_on_one_node(tmp_path: Path, policy: str,
                                                        short: bool) -> None:
    """Three 2-GPU pods (100% demand) on two 3-GPU nodes: one per node, the third fails."""
    nodes, pods = write_trace(tmp_path, ["a,96000,1000000,3,G2", "b,96000,1000000,3,G2"],
                              ["pair,4000,10000,2,1000"], short)
    report = run_arrival(nodes, pods, policy, demand=1.0, seed=1)
    assert report["pods_arrived"] == 3
    assert report["failed"] == 1
    assert report["unallocated_gpus"] == 2
    assert report["allocation_at_demand"] == pytest.approx(4 / 6)


@pytest.mark.parametrize("policy, eight_gpu_pod_fits", [
    ("fgd", True), ("binpack", True), ("spread", False)])
def test_packing_policies_keep_a_whole_machine_for_the_eight_gpu_pod(
        policy: str, eight_gpu_pod_fits: bool) -> None:
    """One of two 8-GPU nodes runs a 1-GPU pod; another 1-GPU pod, then an 8-GPU pod arrive."""
    cluster = Cluster([TraceNode("busy", 96000, 1_000_000, 8, "G"),
                       TraceNode("idle", 96000, 1_000_000, 8, "G")])
    one, eight = Shape(1000, 1000, 1, 1000), Shape(8000, 8000, 8, 1000)
    cluster.take(0, [0], one)
    chooser = make_arrival_policy(policy, cluster, [one] * 9 + [eight],
                                  np.random.default_rng(0))
    for shape in (one, eight):
        choice = chooser.choose(shape, cluster.feasible(shape))
        if choice is not None:
            cluster.take(choice[0], choice[1], shape)
            chooser.placed(choice[0])
    assert cluster.used_milli == (10_000 if eight_gpu_pod_fits else 2000)


def arrival_order_names(nodes: list[TraceNode], pods: list[Any], demand: float,
                        seed: int) -> list[str]:
    pods = sorted(pods, key=lambda pod: pod.name)
    shapes = [pod_shape(pod) for pod in pods]
    capacity = sum(node.gpu for node in nodes) * 1000
    return [pods[i].name for i in arrival_order(shapes, capacity, demand,
                                                np.random.default_rng(seed))]


def test_demand_above_the_workload_adds_copies_and_below_drops_pods() -> None:
    shapes = [Shape(1000, 1000, 1, 1000), Shape(1000, 1000, 0, 0), Shape(1000, 1000, 2, 1000)]
    rng = np.random.default_rng(7)
    grown = arrival_order(shapes, 10_000, 1.3, rng)
    assert sorted(grown[:3]) == [0, 1, 2]
    asked = sum(shapes[i].gpu_milli for i in grown)
    assert 13_000 - 2000 < asked <= 13_000
    shrunk = arrival_order(shapes, 1000, 1.0, np.random.default_rng(7))
    assert sum(shapes[i].gpu_milli for i in shrunk) <= 1000
    assert len(set(shrunk)) == len(shrunk)


def _cluster_with_shares(left: list[int]) -> Cluster:
    """One-GPU nodes named n0, n1, ... whose GPUs have these milli-GPU left."""
    cluster = Cluster([TraceNode(f"n{i}", 96000, 1_000_000, 1, "G") for i in range(len(left))])
    for node, room in enumerate(left):
        if room < 1000:
            cluster.take(node, [0], Shape(0, 0, 1, 1000 - room))
    return cluster


def test_fgd_keeps_room_for_the_common_share_where_best_fit_does_not() -> None:
    """Shares of 500 dominate. A 400-share arrives; GPUs have 600 and 900 left.

    Best fit takes the 600 GPU and leaves 200 and 900: one more 500-share fits. FGD takes the
    900 GPU, leaving 600 and 500: two more fit.
    """
    pod = Shape(0, 0, 1, 400)
    types = PodTypes([Shape(0, 0, 1, 500)] * 9 + [pod], ["G", "G"])
    outcomes = {}
    for name in ("binpack", "fgd"):
        cluster = _cluster_with_shares([600, 900])
        policy = BinpackArrival(cluster) if name == "binpack" else FgdArrival(cluster, types)
        placed = 0
        for shape in (pod, Shape(0, 0, 1, 500), Shape(0, 0, 1, 500)):
            choice = policy.choose(shape, cluster.feasible(shape))
            if choice is not None:
                cluster.take(choice[0], choice[1], shape)
                policy.placed(choice[0])
                placed += 1
        outcomes[name] = placed
    assert outcomes == {"binpack": 2, "fgd": 3}


def test_fgd_does_not_strand_gpus_behind_exhausted_cpu() -> None:
    """Two idle 8-GPU nodes; a CPU-hungry one-GPU pod goes where the CPU left still feeds GPUs."""
    cluster = Cluster([TraceNode("rich", 80000, 1_000_000, 8, "G"),
                       TraceNode("tight", 20000, 1_000_000, 8, "G")])
    typical = Shape(10000, 1000, 1, 1000)
    policy = FgdArrival(cluster, PodTypes([typical], cluster.models))
    hungry = Shape(16000, 1000, 1, 1000)
    node, gpus = policy.choose(hungry, cluster.feasible(hungry))
    assert cluster.names[node] == "rich" and gpus == [0]


def test_cli_arrival_json_table_and_plot(tmp_path: Path,
                                         run_module: Callable[..., Any]) -> None:
    write_trace(tmp_path, ["a,64000,262144,8,G2", "b,64000,262144,8,G2", "c,32000,131072,2,T4"],
                ["one,8000,30000,1,1000", "share,4000,10000,1,300", "two,16000,60000,2,1000",
                 "cpu,2000,4000,0,0", "t4,4000,8000,1,1000,T4"], short=False)
    args = ["--mode", "arrival", "--nodes", str(tmp_path / "nodes.csv"), "--pods",
            str(tmp_path / "pods.csv"), "--policy", "all", "--seeds", "2", "--demand", "1.3"]
    result = run_module("gpu_sched.simulate", *args, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [s["policy"] for s in report["summary"]] == list(ARRIVAL_POLICIES)
    assert len(report["runs"]) == 2 * len(ARRIVAL_POLICIES)
    for run in report["runs"]:
        assert len(run["allocation_by_arrival_percent"]) == 131
        assert run["allocation_at_demand"] == pytest.approx(
            run["allocation_by_arrival_percent"][130] or 1 - run["unallocated_gpus"] / 18)
        assert 0 < run["allocation_at_demand"] <= 1
        assert 0 <= run["unallocated_gpus"] < 18
    again = run_module("gpu_sched.simulate", *args, "--json")
    assert json.loads(again.stdout) == report

    table = run_module("gpu_sched.simulate", *args)
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == [
        "policy", "seeds", "alloc@100%", "alloc@130%", "unallocated", "GPUs", "fragmented",
        "GPUs", "failed", "pods"]
    if importlib.util.find_spec("matplotlib") is not None:
        plot = run_module("gpu_sched.simulate", *args, "--plot", str(tmp_path / "a.png"))
        assert plot.returncode == 0, plot.stderr
        assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_short_layout_cannot_be_replayed_by_time(tmp_path: Path,
                                                 run_module: Callable[..., Any]) -> None:
    write_trace(tmp_path, ["a,64000,262144,8,G2"], ["one,8000,30000,1,1000"], short=True)
    result = run_module("gpu_sched.simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods",
                        str(tmp_path / "pods.csv"))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"gpu_sched.simulate: {tmp_path / 'pods.csv'} has no creation_time: "
        "replay it with --mode arrival")


def test_bench_runs_from_a_checkout_without_pythonpath(
        tmp_path: Path, run_module: Callable[..., Any]) -> None:
    """`python3 -m bench.gpu_arrival` from the repository root, as BENCHMARKS.md runs it."""
    write_trace(tmp_path, ["n1,64000,262144,8,V100M32", "n2,64000,262144,8,V100M32"],
                [f"p{index},4000,16384,1,1000" for index in range(16)])
    (tmp_path / "nodes.csv").rename(tmp_path / "openb_node_list_gpu_node.csv")
    (tmp_path / "pods.csv").rename(tmp_path / "openb_pod_list_default.csv")
    result = run_module("bench.gpu_arrival", "--trace", str(tmp_path), "--seeds", "1", "--jobs",
                        "1", "--workloads", "default", "--policies", "binpack", pythonpath=False)
    assert result.returncode == 0, result.stderr
    assert "| workload | binpack 100% / 130% (1 seeds) |" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("| default | ")
