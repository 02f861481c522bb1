"""Node choice: binpack (the default), spread (Kubernetes' own behaviour, for comparison) and random.

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
from collections.abc import Sequence

from gpu_sched.allocation import MILLI_PER_GPU, GpuRequest, NodeGpus, Placement

MAX_SCORE = 10


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


POLICY_NAMES = ("binpack", "spread", "random")


def make_policy(name: str, seed: int | None = None) -> Policy:
    if name == "binpack":
        return BinpackPolicy()
    if name == "spread":
        return SpreadPolicy()
    if name == "random":
        return RandomPolicy(seed)
    raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")
