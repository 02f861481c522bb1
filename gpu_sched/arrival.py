"""The arrival experiment: pods arrive until they ask for a given share of the cluster's GPUs.

This is how the trace's publishers compare GPU schedulers. The workload's pods arrive in a
seeded random order; when they ask for less than `demand` times the cluster's GPU capacity,
copies of pods drawn at random arrive after them until the next copy would overshoot, and when
they ask for more, pods drawn at random are dropped. Pods never leave. Each pod goes to one
node that has the CPU, memory, GPU model and GPU room it asks for, chosen by the policy, or
fails. The measure is the share of GPU capacity allocated as demand arrives: for each whole
percent of arrived GPU demand, the mean allocated share over the pods whose arrival rounds to
that percent (the neighbouring percents when none does). When pods are too coarse for any
arrival to land near the full demand, the figure at full demand is the final allocated share.

Nodes are numpy arrays (free milli-GPU per GPU, CPU and memory left) so each policy scores all
nodes in a few vector operations; the policies here are the extender's (`binpack`, `spread`,
`random`, `fgd`) expressed over those arrays. GPU links are not modelled: the trace does not
record them, and the experiment is about which node, not which GPUs of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from gpu_sched.fragmentation import (
    FGD_COVERAGE,
    MILLI,
    Aggregates,
    PodTypes,
    Shape,
    fragmentation,
    model_access,
    node_waste,
    placement_delta,
)
from gpu_sched.policies import request_shape
from gpu_sched.trace import TraceError, TraceNode, TracePod

ARRIVAL_POLICIES = ("fgd", "binpack", "spread", "random")


def pod_shape(pod: TracePod) -> Shape:
    """A trace pod's ask; num_gpu 1 with gpu_milli below 1000 is a share, else whole GPUs."""
    return request_shape(pod.request())


class Cluster:
    """Free milli-GPU of every GPU, CPU and memory left, per node; nodes in name order."""

    def __init__(self, nodes: list[TraceNode]) -> None:
        nodes = sorted(nodes, key=lambda node: node.sn)
        self.names = [node.sn for node in nodes]
        self.models = [node.model for node in nodes]
        width = max((node.gpu for node in nodes), default=0) or 1
        self.gpu_left = np.zeros((len(nodes), width), dtype=np.int64)
        for index, node in enumerate(nodes):
            self.gpu_left[index, :node.gpu] = MILLI
        self.gpu_count = np.array([node.gpu for node in nodes], dtype=np.int64)
        self.cpu_left = np.array([node.cpu_milli for node in nodes], dtype=np.int64)
        self.memory_left = np.array([node.memory_mib for node in nodes], dtype=np.int64)
        self.free = self.gpu_left.sum(axis=1)
        self.capacity_milli = int(self.free.sum())
        self.used_milli = 0
        self._access: dict[frozenset[str], np.ndarray] = {}
        self._state_ids: dict[tuple[Any, ...], int] = {}
        self.state = np.array([self._state_of(node) for node in range(len(nodes))],
                              dtype=np.int64)
        """Equal numbers for nodes in equal states (model, CPU and memory left, GPU rooms in any
        order), so a policy can score one node of each state."""

    def _state_of(self, node: int) -> int:
        key = (self.models[node], int(self.cpu_left[node]), int(self.memory_left[node]),
               tuple(sorted(self.gpu_left[node].tolist())))
        return self._state_ids.setdefault(key, len(self._state_ids))

    def access(self, models: frozenset[str]) -> np.ndarray:
        if models not in self._access:
            self._access[models] = model_access(models, self.models)
        return self._access[models]

    def feasible(self, shape: Shape) -> np.ndarray:
        ok = self.access(shape.models) & (self.cpu_left >= shape.cpu) \
            & (self.memory_left >= shape.memory)
        if shape.gpus:
            ok &= (self.gpu_left >= shape.milli).sum(axis=1) >= shape.gpus
        return ok

    def whole_free(self) -> np.ndarray:
        return (self.gpu_left == MILLI).sum(axis=1)

    def take(self, node: int, gpus: list[int], shape: Shape) -> None:
        for gpu in gpus:
            if self.gpu_left[node, gpu] < shape.milli:
                raise ValueError(f"GPU{gpu} of {self.names[node]} has no room for {shape}")
            self.gpu_left[node, gpu] -= shape.milli
        self.free[node] -= shape.milli * len(gpus)
        self.cpu_left[node] -= shape.cpu
        self.memory_left[node] -= shape.memory
        self.used_milli += shape.milli * len(gpus)
        self.state[node] = self._state_of(node)

    def first_whole(self, node: int, count: int) -> list[int]:
        return [int(gpu) for gpu in np.flatnonzero(self.gpu_left[node] == MILLI)[:count]]

    def best_fit_share(self, node: int, milli: int) -> int:
        """The GPU with the least room that still fits the share; lowest index on a tie."""
        row = self.gpu_left[node]
        return int(np.argmin(np.where(row >= milli, row, MILLI + 1)))

    def fragmentation(self, types: PodTypes) -> float:
        """The cluster's fragmentation in milli-GPU: the sum of every node's F for these types."""
        aggregates = Aggregates(types, self.gpu_left)
        return float(fragmentation(types, self.free, aggregates.count, aggregates.usable,
                                   self.cpu_left, self.memory_left, types.access).sum())


def _gpus_for(cluster: Cluster, node: int, shape: Shape) -> list[int]:
    if not shape.gpus:
        return []
    if shape.milli < MILLI:
        return [cluster.best_fit_share(node, shape.milli)]
    return cluster.first_whole(node, shape.gpus)


class ArrivalPolicy(ABC):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @abstractmethod
    def choose(self, shape: Shape, feasible: np.ndarray) -> tuple[int, list[int]] | None:
        """Node index and GPU indices for the shape, among nodes where `feasible` is set."""

    def placed(self, node: int) -> None:  # noqa: B027 - a hook most policies need not use
        """Called after the cluster changed on `node`."""


def _lexmin(feasible: np.ndarray, *keys: np.ndarray) -> int:
    """Index of the feasible node with the smallest keys (first key first), lowest index on ties."""
    candidates = np.flatnonzero(feasible)
    order = np.lexsort(tuple(key[candidates] for key in reversed(keys)))
    return int(candidates[order[0]])


class BinpackArrival(ArrivalPolicy):
    """The extender's binpack: fewest whole GPUs left free; shares onto the fullest GPU that fits."""

    def choose(self, shape: Shape, feasible: np.ndarray) -> tuple[int, list[int]] | None:
        if not feasible.any():
            return None
        cluster = self.cluster
        whole = cluster.whole_free()
        untouched = (cluster.free == cluster.gpu_count * MILLI).astype(np.int64)
        if shape.gpus and shape.milli < MILLI:
            left = cluster.gpu_left
            partly = np.where((left >= shape.milli) & (left < MILLI), left, MILLI + 1).min(axis=1)
            has_partly = partly <= MILLI
            node = _lexmin(feasible, (~has_partly).astype(np.int64),
                           np.where(has_partly, partly - shape.milli, MILLI - shape.milli),
                           np.where(has_partly, whole, whole - 1), untouched)
        else:
            node = _lexmin(feasible, whole - shape.gpus, untouched)
        return node, _gpus_for(cluster, node, shape)


class SpreadArrival(ArrivalPolicy):
    """Least allocated GPU share after placing, as kube-scheduler's default scoring."""

    def choose(self, shape: Shape, feasible: np.ndarray) -> tuple[int, list[int]] | None:
        if not feasible.any():
            return None
        cluster = self.cluster
        capacity = np.maximum(cluster.gpu_count * MILLI, 1)
        used_after = (capacity - cluster.free + shape.gpu_milli) / capacity
        node = _lexmin(feasible, used_after)
        return node, _gpus_for(cluster, node, shape)


class RandomArrival(ArrivalPolicy):
    def __init__(self, cluster: Cluster, rng: np.random.Generator) -> None:
        super().__init__(cluster)
        self.rng = rng

    def choose(self, shape: Shape, feasible: np.ndarray) -> tuple[int, list[int]] | None:
        candidates = np.flatnonzero(feasible)
        if not len(candidates):
            return None
        node = int(candidates[self.rng.integers(len(candidates))])
        return node, _gpus_for(self.cluster, node, shape)


class FgdArrival(ArrivalPolicy):
    """Fragmentation gradient descent: the node (and for a share, the GPU) where the workload's
    expected waste (fragmentation.waste) grows least.

    Ties, common among identical idle machines, go to the binpack order (fewest whole GPUs left
    free, a used node before an idle one), so idle machines stay whole.
    """

    def __init__(self, cluster: Cluster, types: PodTypes) -> None:
        super().__init__(cluster)
        self.types = types
        self.aggregates = Aggregates(types, cluster.gpu_left)
        self.current = node_waste(types, self.aggregates, cluster.free, cluster.cpu_left,
                                  cluster.memory_left, np.arange(len(cluster.names)))

    def choose(self, shape: Shape, feasible: np.ndarray) -> tuple[int, list[int]] | None:
        cluster = self.cluster
        nodes = np.flatnonzero(feasible)
        if not len(nodes):
            return None
        # One candidate per node state (the lowest-numbered node in it), and for a share one
        # per distinct room on that node's GPUs: equal candidates score equally.
        _, first = np.unique(cluster.state[nodes], return_index=True)
        nodes = nodes[np.sort(first)]
        levels = None
        if shape.gpus and shape.milli < MILLI:
            rows = np.sort(cluster.gpu_left[nodes], axis=1)
            distinct = np.ones(rows.shape, dtype=bool)
            distinct[:, 1:] = rows[:, 1:] != rows[:, :-1]
            picks = distinct & (rows >= shape.milli)
            row_index, column = np.nonzero(picks)
            nodes, levels = nodes[row_index], rows[row_index, column]
        delta = placement_delta(self.types, self.aggregates, shape, nodes, levels, cluster.free,
                                cluster.cpu_left, cluster.memory_left, self.current)
        whole_after = (cluster.gpu_left[nodes] == MILLI).sum(axis=1) - (
            shape.gpus if levels is None else (levels == MILLI))
        untouched = cluster.free[nodes] == cluster.gpu_count[nodes] * MILLI
        best = int(np.lexsort((nodes, untouched, whole_after, np.round(delta, 6)))[0])
        node = int(nodes[best])
        if levels is None:
            return node, _gpus_for(cluster, node, shape)
        gpu = int(np.flatnonzero(cluster.gpu_left[node] == levels[best])[0])
        return node, [gpu]

    def placed(self, node: int) -> None:  # noqa: B027 - a hook most policies need not use
        cluster = self.cluster
        self.aggregates.refresh(node, cluster.gpu_left[node])
        self.current[node] = node_waste(self.types, self.aggregates, cluster.free,
                                        cluster.cpu_left, cluster.memory_left,
                                        np.array([node]))[0]


def make_arrival_policy(name: str, cluster: Cluster, shapes: list[Shape],
                        rng: np.random.Generator) -> ArrivalPolicy:
    if name == "fgd":
        return FgdArrival(cluster, PodTypes(shapes, cluster.models, FGD_COVERAGE))
    if name == "binpack":
        return BinpackArrival(cluster)
    if name == "spread":
        return SpreadArrival(cluster)
    if name == "random":
        return RandomArrival(cluster, rng)
    raise ValueError(f"unknown policy {name!r} (choose from {', '.join(ARRIVAL_POLICIES)})")


def arrival_order(shapes: list[Shape], capacity_milli: int, demand: float,
                  rng: np.random.Generator) -> list[int]:
    """Indices of the pods that arrive, in order: the workload shuffled, then random copies.

    Copies are drawn until the next one would take the GPU demand past `demand` x capacity;
    a workload asking for more than that loses pods drawn at random instead.
    """
    requests = np.array([shape.gpu_milli for shape in shapes], dtype=np.int64)
    if not requests.sum():
        raise TraceError("the workload asks for no GPUs, so there is no GPU demand to scale")
    target = demand * capacity_milli
    order = list(rng.permutation(len(shapes)))
    total = int(requests.sum())
    if total > target:
        keep = np.ones(len(order), dtype=bool)
        for position in rng.permutation(len(order)):
            if total <= target:
                break
            keep[position] = False
            total -= int(requests[order[position]])
        return [int(index) for index, kept in zip(order, keep, strict=True) if kept]
    while True:
        index = int(rng.integers(len(shapes)))
        if total + requests[index] > target:
            return [int(index) for index in order]
        order.append(index)
        total += int(requests[index])


def _by_percent(arrived: np.ndarray, values: np.ndarray, capacity: int,
                last: int) -> list[float | None]:
    """Mean value over the arrivals whose demand rounds to each percent, 0..last."""
    percent = np.rint(arrived * 100 / capacity).astype(np.int64)
    sums = np.bincount(percent, weights=values, minlength=last + 2)
    counts = np.bincount(percent, minlength=last + 2)
    result: list[float | None] = []
    for p in range(last + 1):
        if counts[p]:
            result.append(float(sums[p] / counts[p]))
            continue
        low, high = max(p - 1, 0), p + 2
        near = counts[low:high].sum()
        result.append(float(sums[low:high].sum() / near) if near else None)
    return result


Placer = Callable[[int, Shape], tuple[int, list[int]] | None]
"""Given a pod's index in the workload and its shape, the node index and GPU indices it gets."""


def run_arrival(nodes: list[TraceNode], pods: list[TracePod], policy: str, demand: float = 1.3,
                seed: int = 0) -> dict[str, Any]:
    """One run of the experiment; see the module docstring for what is measured."""
    workload = Workload(nodes, pods, demand, seed)
    chooser = make_arrival_policy(policy, workload.cluster, workload.shapes, workload.rng)

    def place(_: int, shape: Shape) -> tuple[int, list[int]] | None:
        return chooser.choose(shape, workload.cluster.feasible(shape))

    return workload.measure(place, chooser.placed, {"mode": "arrival", "policy": policy})


class Workload:
    """One seeded arrival of a workload's pods onto a fresh cluster, and its measurement.

    The arrival order is drawn from `rng` first; the rng goes on to the placer (a random policy
    draws from it), so a seed fixes the arrivals whatever places them.
    """

    def __init__(self, nodes: list[TraceNode], pods: list[TracePod], demand: float,
                 seed: int) -> None:
        if not pods:
            raise TraceError("the workload has no pods")
        self.cluster = Cluster(nodes)
        if not self.cluster.capacity_milli:
            raise TraceError("the cluster has no GPUs")
        self.pods = sorted(pods, key=lambda pod: pod.name)
        self.shapes = [pod_shape(pod) for pod in self.pods]
        self.demand = demand
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.order = arrival_order(self.shapes, self.cluster.capacity_milli, demand, self.rng)

    def measure(self, place: Placer, placed: Callable[[int], None],
                labels: dict[str, Any]) -> dict[str, Any]:
        """Every arrival placed by `place` and taken from the cluster (`placed` is told the node
        after), with the figures the module docstring lists."""
        cluster, shapes, order = self.cluster, self.shapes, self.order
        measured = PodTypes(shapes, cluster.models, memory=False)
        arrived = np.zeros(len(order), dtype=np.int64)
        used = np.zeros(len(order), dtype=np.int64)
        fragmented_at_100: float | None = None
        used_at_100: float | None = None
        demand_so_far = failed = failed_gpu = gpu_pods = 0
        capacity = cluster.capacity_milli
        for position, index in enumerate(order):
            shape = shapes[index]
            demand_so_far += shape.gpu_milli
            gpu_pods += shape.gpus > 0
            choice = place(int(index), shape)
            if choice is None:
                failed += 1
                failed_gpu += shape.gpus > 0
            else:
                node, gpus = choice
                cluster.take(node, gpus, shape)
                placed(node)
            arrived[position] = demand_so_far
            used[position] = cluster.used_milli
            if fragmented_at_100 is None and demand_so_far >= capacity:
                fragmented_at_100 = cluster.fragmentation(measured) / MILLI
                used_at_100 = cluster.used_milli / capacity
        last = int(round(self.demand * 100))
        allocation = _by_percent(arrived, used / capacity, capacity, last)
        at_100 = allocation[100] if last >= 100 else None
        return {
            **labels,
            "seed": self.seed,
            "demand": self.demand,
            "nodes": len(cluster.names),
            "gpus": capacity // MILLI,
            "pods_arrived": len(order),
            "gpu_pods_arrived": gpu_pods,
            "failed": failed,
            "failed_gpu_pods": failed_gpu,
            "allocation_by_arrival_percent": allocation,
            "allocation_at_100": at_100 if at_100 is not None else used_at_100,
            "allocation_at_demand": (allocation[last] if allocation[last] is not None
                                     else cluster.used_milli / capacity),
            "unallocated_gpus": (capacity - cluster.used_milli) / MILLI,
            "fragmented_gpus_at_100": fragmented_at_100,
            "fragmented_gpus": cluster.fragmentation(measured) / MILLI,
        }
