"""The kube-scheduler emulation (gpu_sched.deployed): its sampling rule, its scorers' arithmetic
against hand-worked figures, the extender's weight, and runs on small generated traces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_sched.allocation import GpuRequest
from gpu_sched.arrival import run_arrival
from gpu_sched.deployed import (
    DEPLOYED_POLICIES,
    KubeScheduler,
    NodeSampler,
    SchedulerConfig,
    balanced_allocation,
    least_allocated,
    nodes_to_find,
    run_deployed,
)
from gpu_sched.k8s_objects import GPU_RESOURCE, MILLI_RESOURCE
from gpu_sched.policies import BinpackPolicy
from gpu_sched.trace import TraceNode, TracePod, generate, write_nodes, write_pods

MIB = 1024 * 1024


def pod(name: str, cpu: int, memory: int, gpus: int, milli: int, spec: str = "") -> TracePod:
    return TracePod(name, cpu, memory, gpus, milli, spec, "LS", "Running", 0, None, 0)


@pytest.mark.parametrize(("nodes", "percentage", "expected"), [
    (50, 0, 50),          # under 100 nodes: all of them
    (100, 0, 100),        # 49% is 49, but never fewer than 100
    (1213, 0, 497),       # the trace's cluster: 50 - 1213 // 125 = 41%
    (5000, 0, 500),       # 10%
    (6000, 0, 300),       # 50 - 48 = 2%, raised to the 5% floor
    (20000, 0, 1000),     # 5%
    (1000, 30, 300),      # a configured percentage
    (1000, 5, 100),       # ... still at least 100
    (1000, 100, 1000),
])
def test_nodes_to_find_follows_kube_schedulers_rule(nodes: int, percentage: int,
                                                    expected: int) -> None:
    assert nodes_to_find(nodes, percentage) == expected


def test_each_cycle_starts_where_the_last_stopped() -> None:
    sampler = NodeSampler(200)
    assert sampler.wanted == 100
    fits = np.ones(200, dtype=bool)
    fits[:10] = False
    first, examined = sampler.sample(fits)
    assert examined == 110  # ten that do not fit, then the 100 wanted
    assert first.tolist() == list(range(10, 110))
    second, examined = sampler.sample(fits)
    assert second.tolist() == list(range(110, 200)) + list(range(10, 20))
    assert examined == 110 and sampler.next_start == 20
    fits[:] = False
    fits[5] = True
    only, examined = sampler.sample(fits)
    assert only.tolist() == [5] and examined == 200 and sampler.next_start == 20


def test_least_allocated_and_balanced_allocation_by_hand() -> None:
    """A 64-core, 256 GiB node with 16 cores and 64 GiB requested; the pod asks 4 cores, 0 GiB.

    LeastAllocated: CPU (64000 - 20000) x 100 // 64000 = 68, memory 192 x 100 // 256 = 75,
    (68 + 75) // 2 = 71. BalancedAllocation: fractions 0.3125 and 0.25, (1 - 0.0625 / 2) x 100
    = 96.875, so 96. A resource requested past the node scores 0 in LeastAllocated, and its
    fraction counts as 1 in BalancedAllocation.
    """
    allocatable = np.array([[64000, 64000], [262144 * MIB, 262144 * MIB]], dtype=np.int64)
    requested = np.array([[20000, 70000], [65536 * MIB, 65536 * MIB]], dtype=np.int64)
    assert least_allocated(requested, allocatable).tolist() == [71, 37]
    assert balanced_allocation(requested, allocatable).tolist() == [96, 62]


def test_the_shipped_configuration() -> None:
    config = SchedulerConfig.load()
    assert config.extender_weight == 10
    assert config.percentage_of_nodes_to_score == 0
    assert {"cpu", "memory", GPU_RESOURCE, MILLI_RESOURCE} <= config.managed
    assert config.sends(GpuRequest(cpu=1000))
    assert not SchedulerConfig(10, frozenset({GPU_RESOURCE})).sends(GpuRequest(cpu=1000))
    assert SchedulerConfig(10, frozenset({MILLI_RESOURCE})).sends(GpuRequest(milli=300))


def test_the_extenders_score_counts_weight_times_ten() -> None:
    """Two 8-GPU nodes, one with 2 GPUs taken: binpack scores it 10 and the idle one
    round(9 x 1/8) = 1; kube-scheduler adds 10 x 10 x score to its own scorers."""
    nodes = [TraceNode("a", 64000, 262144, 8, "G"), TraceNode("b", 64000, 262144, 8, "G")]
    config = SchedulerConfig(10, frozenset({"cpu", "memory", GPU_RESOURCE}))
    scheduler = KubeScheduler(nodes, BinpackPolicy(), config, np.random.default_rng(0))
    first = scheduler.schedule(GpuRequest(gpus=2, cpu=8000, memory=32768), "first")
    assert first is not None
    taken = first[0]
    request = GpuRequest(gpus=1, cpu=8000, memory=32768)
    candidates = np.array([0, 1])
    totals = scheduler.scores(request, candidates)
    scheduler.config = replace(config, managed=frozenset())
    in_tree = scheduler.scores(request, candidates)
    # The used node: 16 of 64 cores and 64 of 256 GiB after the pod, so 75 and 100; the idle
    # one 87 and 100.
    assert in_tree[taken] == 175 and in_tree[1 - taken] == 187
    assert totals[taken] == 175 + 10 * 10 * 10
    assert totals[1 - taken] == 187 + 10 * 10 * 1


def test_a_pod_retries_on_the_next_sample_when_the_extender_rejects_every_sampled_node(
) -> None:
    """150 nodes: the first 100 a cycle samples have the wrong model; the pod still lands."""
    nodes = [TraceNode(f"n{i:03d}", 64000, 262144, 8, "A") for i in range(149)]
    nodes.append(TraceNode("n149", 64000, 262144, 8, "B"))
    config = SchedulerConfig.load()
    scheduler = KubeScheduler(nodes, BinpackPolicy(), config, np.random.default_rng(0))
    placed = scheduler.schedule(GpuRequest(gpus=1, models=frozenset({"B"}), cpu=1000,
                                           memory=1024), "b")
    assert placed is not None and scheduler.nodes[placed[0]].name == "n149"
    assert scheduler.sampler.next_start == 50
    assert scheduler.schedule(GpuRequest(gpus=1, models=frozenset({"C"}), cpu=1000,
                                         memory=1024), "c") is None


@pytest.mark.parametrize("policy", ["binpack", "fgd", "spread", "fgd-warm"])
def test_asking_the_extender_once_per_node_state_places_as_asking_about_every_node(
        policy: str) -> None:
    nodes, pods = generate(130, 900, 4)
    exact = run_deployed(nodes, pods, policy, 1.3, 11, exact=True)
    shortcut = run_deployed(nodes, pods, policy, 1.3, 11)
    assert shortcut == exact


@pytest.mark.parametrize("policy", DEPLOYED_POLICIES)
def test_runs_on_a_generated_trace_report_what_the_simulator_reports(policy: str) -> None:
    nodes, pods = generate(40, 600, 2)
    report = run_deployed(nodes, pods, policy, 1.3, 5)
    simulated = run_arrival(nodes, pods, "binpack", 1.3, 5)
    assert report["mode"] == "deployed" and report["policy"] == policy
    assert report["pods_arrived"] == simulated["pods_arrived"]
    assert set(report) == set(simulated)
    assert report["allocation_at_100"] is not None
    assert 0.5 < report["allocation_at_demand"] <= 1.0


def test_cpu_and_memory_bind_as_kube_scheduler_checks_them() -> None:
    """Two one-GPU pods of 6 cores each on an 8-core node: kube-scheduler's filter refuses the
    second, whatever the extender thinks of the node's GPUs."""
    nodes = [TraceNode("small", 8000, 65536, 4, "G")]
    pods = [pod("a", 6000, 1024, 1, 1000), pod("b", 6000, 1024, 1, 1000)]
    report = run_deployed(nodes, pods, "fgd", 0.5, 1)
    assert report["pods_arrived"] == 2 and report["failed"] == 1
    assert report["unallocated_gpus"] == 3


def test_bench_deployed_mode_prints_means_and_intervals(
        tmp_path: Path, run_module: Callable[..., Any]) -> None:
    """On a generated trace, whose pods are too coarse for an arrival to land at exactly 100%
    demand (allocation_at_100 was once None there, and the table failed on it)."""
    nodes, pods = generate(20, 200, 1)
    write_nodes(tmp_path / "openb_node_list_gpu_node.csv", nodes)
    write_pods(tmp_path / "openb_pod_list_default.csv", pods)
    result = run_module("bench.gpu_arrival", "--trace", str(tmp_path), "--mode", "deployed",
                        "--seeds", "2", "--jobs", "1", "--workloads", "default", "--policies",
                        "binpack", pythonpath=False)
    assert result.returncode == 0, result.stderr
    assert "| workload | deployed binpack 100% / 130% (2 seeds) |" in result.stdout
    row = result.stdout.splitlines()[-1]
    assert row.startswith("| default | ") and " ± " in row
