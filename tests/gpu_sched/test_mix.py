"""The pod mix fgd learns online: each pod once, from the extender's verbs and its resync's
listing of every pod (pending ones included), and in the kube-scheduler emulation likewise."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gpu_sched.allocation import GpuRequest, NodeGpus
from gpu_sched.arrival import Cluster, make_arrival_policy
from gpu_sched.deployed import KubeScheduler, SchedulerConfig
from gpu_sched.fragmentation import FGD_COVERAGE, Shape
from gpu_sched.policies import FgdPolicy, request_shape
from gpu_sched.topology import single_socket_pcie
from gpu_sched.trace import TraceNode

WHOLE = GpuRequest(gpus=1, cpu=4000, memory=16384)
SHARE = GpuRequest(milli=500, cpu=4000, memory=16384)


def test_fgd_counts_a_pod_once_however_often_it_is_told_of_it() -> None:
    policy = FgdPolicy()
    for _ in range(3):
        policy.learn("ml/retried", WHOLE)
    policy.learn("ml/other", SHARE)
    assert policy.mix() == Counter({request_shape(WHOLE): 1, request_shape(SHARE): 1})


def test_a_pod_told_of_again_stays_remembered_while_older_keys_are_forgotten() -> None:
    policy = FgdPolicy()
    policy.KEYS_KEPT = 2
    policy.learn("pending", WHOLE)
    policy.learn("a", SHARE)
    policy.learn("pending", WHOLE)
    policy.learn("b", SHARE)
    policy.learn("pending", WHOLE)
    assert policy.mix()[request_shape(WHOLE)] == 1
    policy.learn("a", SHARE)
    assert policy.mix()[request_shape(SHARE)] == 3


def test_the_extender_learns_every_listed_pod_once_pending_ones_included(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """A pod no node has CPU for never reaches /filter or /prioritize; the resync's listing
    still teaches it. Pods asked about at /filter and /prioritize, again and again, and listed
    after, count once; finished pods and pods asking for nothing do not count."""
    fake_api.add_node(node_json("gpu-a", gpus=8, cpu="16"))
    fake_api.add_pod(pod_json("running", gpus=2, node="gpu-a", assigned="0,1", cpu="8"))
    fake_api.add_pod(pod_json("too-big", gpus=1, cpu="64", memory="256Gi"))
    done = pod_json("done", gpus=4, cpu="2", node="gpu-a", assigned="2,3,4,5")
    done["status"]["phase"] = "Succeeded"
    fake_api.add_pod(done)
    fake_api.add_pod(pod_json("asks-nothing", cpu="0", memory="0"))
    client = start_extender(policy="fgd")
    running = request_shape(GpuRequest(gpus=2, cpu=8000, memory=16384))
    too_big = request_shape(GpuRequest(gpus=1, cpu=64000, memory=256 * 1024))
    assert client.extender.policy.mix() == Counter({running: 1, too_big: 1})

    share = fake_api.add_pod(pod_json("share", milli=300, cpu="2", memory="8Gi"))
    args = {"Pod": share, "NodeNames": ["gpu-a"]}
    for _ in range(2):
        assert client.post("/filter", args)[1]["NodeNames"] == ["gpu-a"]
        assert client.post("/prioritize", args)[1] == [{"Host": "gpu-a", "Score": 10}]
    client.extender.resync()
    shared = request_shape(GpuRequest(milli=300, cpu=2000, memory=8192))
    assert client.extender.policy.mix() == Counter({running: 1, too_big: 1, shared: 1})


def test_the_emulation_learns_a_pod_kube_scheduler_filters_out_at_the_next_resync() -> None:
    """An 8-core node: a 16-core pod fails in kube-scheduler's own filter, so the extender first
    hears of it when its resync lists it, every 2 arrivals here; a fitting pod reaches /filter
    and counts at once."""
    config = SchedulerConfig.load()
    policy = FgdPolicy()
    scheduler = KubeScheduler([TraceNode("small", 8000, 65536, 4, "G")], policy, config,
                              np.random.default_rng(0), resync_arrivals=2)
    too_big = GpuRequest(gpus=1, cpu=16000, memory=1024)
    assert scheduler.schedule(too_big, "0") is None
    assert policy.mix() == Counter()
    assert scheduler.schedule(WHOLE, "1") is not None
    assert policy.mix() == Counter([request_shape(WHOLE)])
    assert scheduler.schedule(SHARE, "2") is not None
    assert policy.mix() == Counter([request_shape(too_big), request_shape(WHOLE),
                                    request_shape(SHARE)])


COMMON = GpuRequest(gpus=1, cpu=1000, memory=1024)
RARE = GpuRequest(milli=600, cpu=1000, memory=1024)
SMALL = GpuRequest(milli=300, cpu=1000, memory=1024)
ROOMS = {"a-600-left": 400, "b-400-left": 600}
"""Two one-GPU nodes and the milli-GPU already taken on each."""


def _mix(rare_percent: int) -> list[Shape]:
    return [request_shape(COMMON)] * (100 - rare_percent) + [request_shape(RARE)] * rare_percent


@pytest.mark.parametrize(("rare_percent", "chosen"), [
    (round(100 * (1 - FGD_COVERAGE)) - 5, "a-600-left"),
    (round(100 * (1 - FGD_COVERAGE)) + 5, "b-400-left"),
])
def test_fgd_weighs_only_the_common_shapes_covering_fgd_coverage_of_the_mix(
        rare_percent: int, chosen: str) -> None:
    """A 300 share fits either node. Weighed, the 600 share would keep the GPU with 600 left for
    itself, so the share goes to the other; while it is in the tail past FGD_COVERAGE nothing is
    weighed but whole GPUs, which neither node has, and the tie goes to the first name. The
    extender's policy and the arrival simulator's agree."""
    nodes = []
    for name, taken in ROOMS.items():
        node = NodeGpus(name, single_socket_pcie(1), "G", 8000, 65536)
        node.used = [taken]
        nodes.append(node)
    extender_choice = FgdPolicy(known=_mix(rare_percent)).choose(SMALL, nodes)
    assert extender_choice is not None and extender_choice[0].name == chosen

    cluster = Cluster([TraceNode(name, 8000, 65536, 1, "G") for name in ROOMS])
    for index, taken in enumerate(ROOMS.values()):
        cluster.take(index, [0], Shape(0, 0, 1, taken))
    simulator = make_arrival_policy("fgd", cluster, _mix(rare_percent), np.random.default_rng(0))
    small = request_shape(SMALL)
    simulator_choice = simulator.choose(small, cluster.feasible(small))
    assert simulator_choice is not None and cluster.names[simulator_choice[0]] == chosen
