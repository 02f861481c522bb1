"""Node choice: binpack (the default), spread (Kubernetes' own behaviour, for comparison), random,
and fgd (fragmentation gradient descent, see fragmentation.py).

A policy ranks the nodes that can take a request with a cheap preference from GPU counts alone, and
only for the nodes tied at the best preference does it work out the concrete GPUs, breaking the tie
by link quality and then by node name. The cheap pass keeps the simulator fast on big traces; the
tie break keeps multi-GPU jobs on well-connected GPUs.

Binpack is best fit: the node left with the fewest free whole GPUs wins, and a node nobody uses yet
loses ties, so whole machines stay free for the jobs that need them. A shared request first looks for
a partly used GPU with the least room that still fits, so it does not break into a free GPU.
"""

from __future__ import annotations

import random
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence

import numpy as np

from gpu_sched.allocation import MILLI_PER_GPU, GpuRequest, NodeGpus, Placement
from gpu_sched.fragmentation import Aggregates, PodTypes, Shape, node_waste, placement_delta

MAX_SCORE = 10
UNTRACKED = 2**40
"""CPU and memory left assumed on every node where the extender does not track them."""


def _used_share_after(node: NodeGpus, request: GpuRequest) -> float:
    taken = request.milli if request.is_shared else request.gpus * MILLI_PER_GPU
    return (node.used_milli() + taken) / (node.capacity * MILLI_PER_GPU)


def _quality(placement: Placement) -> tuple[int, int]:
    return (-(placement.bottleneck or 0), -(placement.total or 0))


class Policy(ABC):
    """Chooses among nodes that all fit the request (see placement.feasible_nodes)."""

    name: str

    @abstractmethod
    def preference(self, node: NodeGpus, request: GpuRequest) -> tuple[float, ...]:
        """Cheap ranking from counts only; lower is better."""

    @abstractmethod
    def share(self, node: NodeGpus, request: GpuRequest) -> float:
        """How much this policy likes the node, from 0 to 1, for the scores sent to kube-scheduler."""

    def choose(self, request: GpuRequest, nodes: Sequence[NodeGpus]
               ) -> tuple[NodeGpus, Placement] | None:
        if not nodes:
            return None
        preferences = [(self.preference(node, request), node) for node in nodes]
        best_preference = min(preference for preference, _ in preferences)
        best: tuple[tuple[int, int], str, NodeGpus, Placement] | None = None
        for preference, node in preferences:
            if preference != best_preference:
                continue
            placement = node.choose(request)
            if placement is None:
                continue
            candidate = (_quality(placement), node.name, node, placement)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return (best[2], best[3]) if best else None

    def scores(self, request: GpuRequest, nodes: Sequence[NodeGpus]) -> dict[str, int]:
        """Scores 0-10: the node choose() would pick gets 10, the others at most 9 by share()."""
        scores = {node.name: min(MAX_SCORE - 1, round((MAX_SCORE - 1) * self.share(node, request)))
                  for node in nodes}
        choice = self.choose(request, nodes)
        if choice is not None:
            scores[choice[0].name] = MAX_SCORE
        return scores


class BinpackPolicy(Policy):
    name = "binpack"

    def preference(self, node: NodeGpus, request: GpuRequest) -> tuple[float, ...]:
        untouched = 1 if node.used_milli() == 0 else 0
        if request.is_shared:
            shared = node.best_shared_gpu(request.milli)
            if shared is not None:
                room_after = MILLI_PER_GPU - node.used[shared] - request.milli
                return (0, room_after, node.free_count(), untouched)
            return (1, MILLI_PER_GPU - request.milli, node.free_count() - 1, untouched)
        return (node.free_count() - request.gpus, untouched)

    def share(self, node: NodeGpus, request: GpuRequest) -> float:
        return _used_share_after(node, request)


class SpreadPolicy(Policy):
    """Least allocated first, as kube-scheduler's default NodeResourcesFit scoring does."""

    name = "spread"

    def preference(self, node: NodeGpus, request: GpuRequest) -> tuple[float, ...]:
        return (_used_share_after(node, request),)

    def share(self, node: NodeGpus, request: GpuRequest) -> float:
        return 1.0 - _used_share_after(node, request)


class RandomPolicy(Policy):
    """Any fitting node, uniformly: a fresh random preference per node means no ties to break.

    Reproducible for a seed when nodes come in the same order; the lock keeps one stream across the
    extender's threads.
    """

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def preference(self, node: NodeGpus, request: GpuRequest) -> tuple[float, ...]:
        with self._lock:
            return (self._rng.random(),)

    def share(self, node: NodeGpus, request: GpuRequest) -> float:
        with self._lock:
            return self._rng.random()


class FgdPolicy(BinpackPolicy):
    """Fragmentation gradient descent over the GPUs the extender sees (fragmentation.waste).

    The workload's pod types are the requests this policy has been asked about, counted as they
    come (halved when they pass `HISTORY`, so the mix follows the workload). The node is the one
    where the expected waste of that mix grows least; binpack's order breaks ties, and inside
    the node the GPUs are picked as for every policy (best links, best-fit share). kube-scheduler
    has checked CPU and memory before the extender sees a pod and the extender does not track
    them, so here the mix is measured on GPUs and GPU models alone.
    """

    name = "fgd"
    HISTORY = 10_000

    def __init__(self) -> None:
        self._seen: Counter[Shape] = Counter()
        self._lock = threading.Lock()

    def _mix(self, shape: Shape) -> Counter[Shape]:
        with self._lock:
            self._seen[shape] += 1
            if sum(self._seen.values()) > self.HISTORY:
                self._seen = Counter({s: n // 2 for s, n in self._seen.items() if n > 1})
            return Counter(self._seen)

    def deltas(self, request: GpuRequest, nodes: Sequence[NodeGpus]) -> np.ndarray:
        """Growth of the expected waste on each node if it took the request (lowest on its GPUs)."""
        shape = Shape(0, 0, request.gpus or 1, request.milli or MILLI_PER_GPU, request.models)
        types = PodTypes(self._mix(shape).elements(), [node.model for node in nodes])
        width = max(node.capacity for node in nodes)
        gpu_left = np.zeros((len(nodes), width), dtype=np.int64)
        for row, node in enumerate(nodes):
            gpu_left[row, :node.capacity] = [MILLI_PER_GPU - used for used in node.used]
        free = gpu_left.sum(axis=1)
        unlimited = np.full(len(nodes), UNTRACKED)
        aggregates = Aggregates(types, gpu_left)
        rows = np.arange(len(nodes))
        before = node_waste(types, aggregates, free, unlimited, unlimited, rows)
        if not request.is_shared:
            return placement_delta(types, aggregates, shape, rows, None, free, unlimited,
                                   unlimited, before)
        candidates, columns = np.nonzero(gpu_left >= request.milli)
        delta = placement_delta(types, aggregates, shape, candidates,
                                gpu_left[candidates, columns], free, unlimited, unlimited, before)
        best = np.full(len(nodes), np.inf)
        np.minimum.at(best, candidates, delta)
        return best

    def choose(self, request: GpuRequest, nodes: Sequence[NodeGpus]
               ) -> tuple[NodeGpus, Placement] | None:
        if not nodes or not request.wants_gpu:
            return super().choose(request, nodes)
        deltas = np.round(self.deltas(request, nodes), 6)
        order = sorted(range(len(nodes)), key=lambda i: (deltas[i], self.preference(nodes[i], request),
                                                         nodes[i].name))
        for index in order:
            placement = nodes[index].choose(request)
            if placement is not None:
                return nodes[index], placement
        return None

    def scores(self, request: GpuRequest, nodes: Sequence[NodeGpus]) -> dict[str, int]:
        """The chosen node 10; the others 0-9, the least waste growth highest."""
        if not nodes or not request.wants_gpu:
            return super().scores(request, nodes)
        deltas = self.deltas(request, nodes)
        low, high = float(deltas.min()), float(deltas.max())
        span = high - low or 1.0
        scores = {node.name: round((MAX_SCORE - 1) * (high - delta) / span)
                  for node, delta in zip(nodes, deltas, strict=True)}
        choice = self.choose(request, nodes)
        if choice is not None:
            scores[choice[0].name] = MAX_SCORE
        return scores


POLICY_NAMES = ("binpack", "spread", "random", "fgd")


def make_policy(name: str, seed: int | None = None) -> Policy:
    if name == "binpack":
        return BinpackPolicy()
    if name == "fgd":
        return FgdPolicy()
    if name == "spread":
        return SpreadPolicy()
    if name == "random":
        return RandomPolicy(seed)
    raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")
