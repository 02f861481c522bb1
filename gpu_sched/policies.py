"""Node choice: fgd (fragmentation gradient descent, see fragmentation.py; the extender's default),
binpack, spread (Kubernetes' own behaviour, for comparison) and random.

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
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from gpu_sched.allocation import MILLI_PER_GPU, GpuRequest, NodeGpus, Placement
from gpu_sched.fragmentation import (
    FGD_COVERAGE,
    Aggregates,
    PodTypes,
    Shape,
    node_waste,
    placement_delta,
)

MAX_SCORE = 10
UNTRACKED = 2**40
"""CPU and memory left assumed on a node that does not say (NodeGpus.cpu_left or memory_left None)."""


def _used_share_after(node: NodeGpus, request: GpuRequest) -> float:
    """Share of the node's GPU capacity in use once the request is placed; a node without GPUs
    (which only CPU-only pods reach) counts as full, as in the arrival simulator."""
    if not node.capacity:
        return 1.0
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

    def learn(self, key: str, request: GpuRequest) -> None:
        """Note a pod of the workload (`key` names it), for policies that weigh the pod mix; the
        others ignore it. Callers: the extender for every pod it is asked about and every pod its
        resync lists, the simulators for every arrival."""
        return None

    def place(self, node: NodeGpus, request: GpuRequest) -> Placement | None:
        """The GPUs of `node` the request gets once the node is chosen (the extender's bind)."""
        return node.choose(request)

    def choose(self, request: GpuRequest, nodes: Sequence[NodeGpus]
               ) -> tuple[NodeGpus, Placement] | None:
        """The node for the request and its GPUs; a CPU-only pod, which takes CPU and memory from
        the node it lands on, goes to the node of the best preference (first name on a tie)."""
        if not nodes:
            return None
        if not request.wants_gpu:
            node = min(nodes, key=lambda node: (self.preference(node, request), node.name))
            return node, Placement((), 0)
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


def _left(values: list[int | None]) -> np.ndarray:
    return np.array([UNTRACKED if value is None else value for value in values], dtype=np.int64)


def request_shape(request: GpuRequest) -> Shape:
    """The request as a pod shape, for the extender and the simulators alike: a share is one GPU
    of `milli`, whole GPUs are `gpus` GPUs of 1000."""
    if request.is_shared:
        return Shape(request.cpu, request.memory, 1, request.milli, request.models)
    return Shape(request.cpu, request.memory, request.gpus,
                 MILLI_PER_GPU if request.gpus else 0, request.models)


class FgdPolicy(BinpackPolicy):
    """Fragmentation gradient descent over the nodes it is shown (fragmentation.waste), deciding
    as the arrival simulator's fgd (arrival.FgdArrival) does for the same nodes and pod mix.

    The workload's pod types are the pods it has been told of through learn(), each counted once
    per key however often it is told (a pod kube-scheduler retries, or one the extender both
    scores and later lists, is one pod), with their CPU, memory, GPUs, share and models; counts
    halve when they pass `HISTORY`, so the mix follows the workload. Until it knows any pod, the
    request in hand is the mix. Waste is measured on
    each node's GPUs, model and CPU and memory left; a node that does not report its CPU or memory
    counts as having plenty. The pod goes where waste grows least; ties go to the node left with
    the fewest whole GPUs free, then to one already in use, then to the first name, as in the
    simulator. A share goes to the GPU of that node where waste grows least (among equals, by the
    same rule, a free GPU, else the fullest), so bind (place()) picks the GPU the score was worked
    out for.
    """

    name = "fgd"
    HISTORY = 10_000
    KEYS_KEPT = 2 * HISTORY
    """Pod keys remembered as counted, the least recently told of forgotten first: a pod told of
    again (a pending pod at every resync) stays remembered, and memory stays bounded."""

    def __init__(self, known: Iterable[Shape] = ()) -> None:
        """`known`: pods to count before any is learned, when the workload's mix is known."""
        self._seen: Counter[Shape] = Counter(known)
        self._counted: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def learn(self, key: str, request: GpuRequest) -> None:
        with self._lock:
            if key in self._counted:
                self._counted.move_to_end(key)
                return
            self._counted[key] = None
            if len(self._counted) > self.KEYS_KEPT:
                self._counted.popitem(last=False)
            self._seen[request_shape(request)] += 1
            if sum(self._seen.values()) > self.HISTORY:
                self._seen = Counter({s: n // 2 for s, n in self._seen.items() if n > 1})

    def mix(self) -> Counter[Shape]:
        """Pods learned (and known) so far, by shape."""
        with self._lock:
            return Counter(self._seen)

    def _mix(self, request: GpuRequest) -> Counter[Shape]:
        """The mix to measure waste against; the request alone while no pod is known."""
        return self.mix() or Counter([request_shape(request)])

    @staticmethod
    def _best(mix: Counter[Shape], request: GpuRequest, nodes: Sequence[NodeGpus]
              ) -> tuple[np.ndarray, np.ndarray]:
        """Per node: the least growth of the mix's expected waste if it took the request, and the
        room (milli-GPU left) of the GPU a share would take for it (1000 for whole GPUs)."""
        shape = request_shape(request)
        types = PodTypes(mix, [node.model for node in nodes], FGD_COVERAGE)
        width = max(node.capacity for node in nodes) or 1
        gpu_left = np.zeros((len(nodes), width), dtype=np.int64)
        for row, node in enumerate(nodes):
            gpu_left[row, :node.capacity] = [MILLI_PER_GPU - used for used in node.used]
        free = gpu_left.sum(axis=1)
        cpu_left = _left([node.cpu_left for node in nodes])
        memory_left = _left([node.memory_left for node in nodes])
        aggregates = Aggregates(types, gpu_left)
        rows = np.arange(len(nodes))
        before = node_waste(types, aggregates, free, cpu_left, memory_left, rows)
        if not request.is_shared:
            delta = placement_delta(types, aggregates, shape, rows, None, free, cpu_left,
                                    memory_left, before)
            return np.round(delta, 6), np.full(len(nodes), MILLI_PER_GPU)
        candidates, columns = np.nonzero(gpu_left >= request.milli)
        levels = gpu_left[candidates, columns]
        delta = np.round(placement_delta(types, aggregates, shape, candidates, levels, free,
                                         cpu_left, memory_left, before), 6)
        # Per node, the first candidate by waste, then by whole GPUs left free (so a free GPU
        # first, as the simulator breaks ties), then the fullest GPU.
        order = np.lexsort((levels, levels != MILLI_PER_GPU, delta, candidates))
        first = np.ones(len(order), dtype=bool)
        first[1:] = candidates[order][1:] != candidates[order][:-1]
        best, room = np.full(len(nodes), np.inf), np.full(len(nodes), MILLI_PER_GPU)
        best[candidates[order][first]] = delta[order][first]
        room[candidates[order][first]] = levels[order][first]
        return best, room

    def _first(self, request: GpuRequest, nodes: Sequence[NodeGpus], delta: np.ndarray,
               room: np.ndarray) -> tuple[NodeGpus, Placement] | None:
        """The best fitting node with its placement; placements are worked out in rank order
        only until one fits."""
        def key(index: int) -> tuple[float, int, int, str]:
            node = nodes[index]
            whole_after = node.free_count() - (int(room[index] == MILLI_PER_GPU)
                                               if request.is_shared else request.gpus)
            return (delta[index], whole_after, int(node.used_milli() == 0), node.name)

        for index in sorted(range(len(nodes)), key=key):
            node = nodes[index]
            placement = (node.share_on(int(room[index]), request.milli) if request.is_shared
                         else node.choose(request) if request.wants_gpu else Placement((), 0))
            if placement is not None:
                return node, placement
        return None

    def place(self, node: NodeGpus, request: GpuRequest) -> Placement | None:
        if not request.is_shared:
            return node.choose(request)
        _, room = self._best(self._mix(request), request, [node])
        return node.share_on(int(room[0]), request.milli)

    def choose(self, request: GpuRequest, nodes: Sequence[NodeGpus]
               ) -> tuple[NodeGpus, Placement] | None:
        if not nodes:
            return None
        delta, room = self._best(self._mix(request), request, nodes)
        return self._first(request, nodes, delta, room)

    def scores(self, request: GpuRequest, nodes: Sequence[NodeGpus]) -> dict[str, int]:
        """The chosen node 10; the others 0-9, the least waste growth highest."""
        if not nodes:
            return {}
        delta, room = self._best(self._mix(request), request, nodes)
        low, high = float(delta.min()), float(delta.max())
        span = high - low or 1.0
        scores = {node.name: round((MAX_SCORE - 1) * (high - value) / span)
                  for node, value in zip(nodes, delta, strict=True)}
        first = self._first(request, nodes, delta, room)
        if first is not None:
            scores[first[0].name] = MAX_SCORE
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
