"""The extender's fgd weighs CPU and memory as the arrival simulator's fgd does, and places
CPU-only pods as it does.

Over HTTP, the extender places a pod sequence as the simulator does on the same cluster: nodes
whose allocatable CPU and memory are written as Kubernetes quantities on the extender's side and
as the trace's numbers on the simulator's, and pods whose CPU and memory asks tell the
fragmentation apart where the GPUs alone would not. The CPU and memory it counts come from the
pods' requests, as kube-scheduler counts them, and from the nodes' allocatable amounts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from gpu_sched.arrival import Cluster, FgdArrival, pod_shape
from gpu_sched.fragmentation import PodTypes, Shape
from gpu_sched.k8s_objects import ObjectError, node_info, pod_cpu_memory
from gpu_sched.trace import TraceNode, TracePod

# name, allocatable cpu and memory as the node reports them, GPUs, model; then the same CPU
# (milli) and memory (MiB) as the trace writes them.
NODES = [
    ("a-cpu-poor", "16", "256Gi", 8, "V100", 16000, 262144),
    ("b-mem-poor", "96000m", "33554432Ki", 8, "V100", 96000, 32768),
    ("c-roomy", "96", "412316860416", 8, "V100", 96000, 393216),
    ("d-t4", "64", "256Gi", 4, "T4", 64000, 262144),
]

# name, cpu and memory asks as the pod writes them, whole GPUs, milli-GPU share, models; then
# the same CPU and memory as the trace writes them.
PODS = [
    ("one-gpu-1", "8", "16Gi", 1, 0, "", 8000, 16384),
    ("share-1", "2", "4Gi", 0, 500, "", 2000, 4096),
    ("one-gpu-2", "8000m", "16384Mi", 1, 0, "", 8000, 16384),
    ("four-gpu-1", "32", "64Gi", 4, 0, "", 32000, 65536),
    ("cpu-only-1", "12", "48Gi", 0, 0, "", 12000, 49152),
    ("share-2", "2", "4Gi", 0, 250, "", 2000, 4096),
    ("t4-1", "4", "8Gi", 1, 0, "T4", 4000, 8192),
    ("one-gpu-3", "8", "16Gi", 1, 0, "", 8000, 16384),
    ("share-3", "2", "4Gi", 0, 500, "", 2000, 4096),
    ("four-gpu-2", "32", "64Gi", 4, 0, "", 32000, 65536),
    ("one-gpu-4", "8", "16Gi", 1, 0, "", 8000, 16384),
    ("cpu-only-2", "4", "200Gi", 0, 0, "", 4000, 204800),
    ("share-4", "2", "4Gi", 0, 500, "V100|T4", 2000, 4096),
    ("one-gpu-5", "8", "16Gi", 1, 0, "", 8000, 16384),
    ("four-gpu-3", "32", "64Gi", 4, 0, "", 32000, 65536),
    ("one-gpu-6", "8", "16Gi", 1, 0, "", 8000, 16384),
]


def trace_nodes(blind: bool = False) -> list[TraceNode]:
    """The cluster as the simulator reads it; `blind` gives every node plenty of CPU and memory."""
    return [TraceNode(name, 10**9 if blind else cpu, 10**9 if blind else memory, gpus, model)
            for name, _, _, gpus, model, cpu, memory in NODES]


def trace_pod(name: str, gpus: int, milli: int, spec: str, cpu: int, memory: int) -> TracePod:
    return TracePod(name, cpu, memory, 1 if milli else gpus, milli or 1000 * bool(gpus), spec,
                    "LS", "Pending", None, None, None)


def simulated(blind: bool = False) -> tuple[list[str | None], dict[str, list[int]]]:
    """The arrival simulator's fgd on the sequence: node per pod (None: fits nowhere) and the
    milli-GPU left on each node's GPUs, sorted. The pod mix is the pods asked about so far, as
    the extender learns it. `blind`: fgd scores as if every node had plenty of CPU and memory
    (which nodes fit still counts them)."""
    cluster = Cluster(trace_nodes())
    scored = Cluster(trace_nodes(blind)) if blind else cluster
    seen: Counter[Shape] = Counter()
    choices: list[str | None] = []
    for name, _, _, gpus, milli, spec, cpu, memory in PODS:
        shape = pod_shape(trace_pod(name, gpus, milli, spec, cpu, memory))
        seen[shape] += 1
        policy = FgdArrival(scored, PodTypes(seen.elements(), cluster.models))
        choice = policy.choose(shape, cluster.feasible(shape))
        if choice is None:
            choices.append(None)
            continue
        node, gpu_indices = choice
        cluster.take(node, gpu_indices, shape)
        if blind:
            scored.take(node, gpu_indices, shape)
        choices.append(cluster.names[node])
    rooms = {name: sorted(cluster.gpu_left[index, :cluster.gpu_count[index]].tolist())
             for index, name in enumerate(cluster.names)}
    return choices, rooms


def test_extender_fgd_places_as_the_simulators_fgd(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    for name, cpu, memory, gpus, model, _, _ in NODES:
        fake_api.add_node(node_json(name, gpus=gpus, model=model, cpu=cpu, memory=memory))
    client = start_extender(policy="fgd", locality_weight=0.0)
    expected, expected_rooms = simulated()
    # kube-scheduler sends the extender only the nodes its own checks pass: CPU and memory left.
    cpu_left = {name: cpu for name, *_, cpu, _ in NODES}
    memory_left = {name: memory for name, *_, memory in NODES}
    placed: list[str | None] = []
    for name, cpu, memory, gpus, milli, spec, cpu_milli, memory_mib in PODS:
        pod = fake_api.add_pod(pod_json(name, gpus=gpus, milli=milli, gpu_spec=spec or None,
                                        cpu=cpu, memory=memory))
        names = [node for node in cpu_left
                 if cpu_left[node] >= cpu_milli and memory_left[node] >= memory_mib]
        status, filtered = client.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        assert status == 200 and filtered["Error"] == ""
        if not filtered["NodeNames"]:
            placed.append(None)
            continue
        status, scores = client.post("/prioritize", {"Pod": pod, "Nodes": None,
                                                     "NodeNames": filtered["NodeNames"]})
        assert status == 200
        best = max(scores, key=lambda entry: entry["Score"])
        assert [entry["Score"] for entry in scores].count(10) == 1
        status, bound = client.post("/bind", {"PodName": name, "PodNamespace": "default",
                                              "PodUID": pod["metadata"]["uid"],
                                              "Node": best["Host"]})
        assert (status, bound) == (200, {"Error": ""})
        cpu_left[best["Host"]] -= cpu_milli
        memory_left[best["Host"]] -= memory_mib
        placed.append(best["Host"])

    assert placed == expected
    rooms: dict[str, list[int]] = {name: [1000] * gpus for name, _, _, gpus, *_ in NODES}
    for (_, name), pod in fake_api.pods.items():
        if "gpu-sched/gpus" not in pod["metadata"].get("annotations", {}):
            continue
        milli = next(p[4] for p in PODS if p[0] == name) or 1000
        for gpu in map(int, pod["metadata"]["annotations"]["gpu-sched/gpus"].split(",")):
            rooms[pod["spec"]["nodeName"]][gpu] -= milli
    assert {name: sorted(left) for name, left in rooms.items()} == expected_rooms


def test_cpu_makes_the_difference_in_the_sequence() -> None:
    """Scoring blind to CPU and memory, the same fgd would send share-3 (2 CPUs) to the CPU-poor
    node, whose 8 CPUs left still take one more 8-CPU one-GPU pod; after the share they would take
    none, and its free GPUs would be stranded for the commonest pod type."""
    share = [pod[0] for pod in PODS].index("share-3")
    seeing, _ = simulated()
    blind, _ = simulated(blind=True)
    assert seeing[:share] == blind[:share]
    assert (seeing[share], blind[share]) == ("b-mem-poor", "a-cpu-poor")


def test_pod_requests_count_as_kube_scheduler_counts_them(pod_json: Callable[..., dict]) -> None:
    """App containers add up (limits stand in for missing requests), a sidecar runs beside them
    and beside the init containers after it, init containers one at a time, overhead on top;
    MiB round up."""
    pod = pod_json("p", cpu="500m", memory="1Gi")
    spec = pod["spec"]
    spec["containers"].append({"name": "logs", "resources": {"limits": {"cpu": "1.5",
                                                                        "memory": "512Mi"}}})
    spec["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "250m", "memory": "268435456"}}},
        {"name": "fetch", "resources": {"requests": {"cpu": "3", "memory": "4Gi"}}},
    ]
    spec["overhead"] = {"cpu": "100m", "memory": "1000000"}
    assert pod_cpu_memory(pod) == (3000 + 250 + 100, 4096 + 256 + 1)
    spec["initContainers"][1]["resources"]["requests"]["cpu"] = "lots"
    with pytest.raises(ObjectError, match="cpu must be a Kubernetes quantity such as 500m"):
        pod_cpu_memory(pod)


def test_node_allocatable_cpu_and_memory(node_json: Callable[..., dict]) -> None:
    info = node_info(node_json("n", cpu="7500m", memory="131072Ki"))
    assert (info.cpu, info.memory) == (7500, 128)
    bare = node_json("n")
    del bare["status"]["allocatable"]["cpu"], bare["status"]["allocatable"]["memory"]
    assert (node_info(bare).cpu, node_info(bare).memory) == (None, None)


def test_resync_counts_the_cpu_of_running_pods_and_not_of_finished_ones(
        fake_api: Any, pod_json: Callable[..., dict], node_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    """Two 16-CPU nodes; a running CPU-only pod holds 8 CPUs of the first, a finished one held 8
    of the second. For a 2-CPU share after 8-CPU one-GPU pods, only the second keeps CPU for
    another of those, so fgd sends it there; GPUs alone would tie and the first name win."""
    for name in ("a", "b"):
        fake_api.add_node(node_json(name, cpu="16", memory="256Gi"))
    fake_api.add_pod(pod_json("web", cpu="8", memory="1Gi", node="a"))
    done = pod_json("batch", cpu="8", memory="1Gi", node="b")
    done["status"]["phase"] = "Succeeded"
    fake_api.add_pod(done)
    client = start_extender(policy="fgd", locality_weight=0.0)
    for index in range(3):
        client.post("/prioritize", {"Pod": pod_json(f"one-{index}", gpus=1, cpu="8"),
                                    "Nodes": None, "NodeNames": ["a", "b"]})
    share = pod_json("share", milli=500, cpu="2", memory="4Gi")
    status, scores = client.post("/prioritize", {"Pod": share, "Nodes": None,
                                                 "NodeNames": ["a", "b"]})
    assert status == 200
    assert {entry["Host"]: entry["Score"] for entry in scores}["b"] == 10
