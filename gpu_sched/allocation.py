"""Which GPUs of one node a request gets.

Whole-GPU requests take the set with the best bottleneck link (then the best sum of links), and among
equals the one that leaves the node's remaining free GPUs best connected, so the next multi-GPU job
on this node still finds a well-linked group. Shared requests (a fraction of one GPU) go best-fit onto
a GPU that is already partly used, so they do not eat into whole free GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations

from gpu_sched.topology import Topology

MILLI_PER_GPU = 1000


class RequestError(ValueError):
    """A GPU request that no node could ever satisfy as written."""


@dataclass(frozen=True)
class GpuRequest:
    """What one pod asks for: whole GPUs, or a share of one GPU in milli-GPU, optionally of given
    models; and its CPU (milli-cores) and memory (MiB), which only the fgd policy weighs."""

    gpus: int = 0
    milli: int = 0
    models: frozenset[str] = field(default_factory=frozenset)
    cpu: int = 0
    memory: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise RequestError(f"GPU count must not be negative, got {self.gpus}")
        if not 0 <= self.milli < MILLI_PER_GPU:
            raise RequestError(f"a shared GPU request must be 1-{MILLI_PER_GPU - 1} milli-GPU, "
                               f"got {self.milli}")
        if self.gpus and self.milli:
            raise RequestError("ask for whole GPUs or a share of one GPU, not both")
        if self.cpu < 0 or self.memory < 0:
            raise RequestError(f"CPU and memory must not be negative, got {self.cpu} milli-CPU "
                               f"and {self.memory} MiB")

    @property
    def wants_gpu(self) -> bool:
        return bool(self.gpus or self.milli)

    @property
    def is_shared(self) -> bool:
        return self.milli > 0

    @property
    def gpu_equivalent(self) -> float:
        """GPUs this request holds, counting a share as its fraction; the unit quotas are kept in."""
        return self.gpus + self.milli / MILLI_PER_GPU

    def accepts_model(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True)
class Placement:
    """GPU indices chosen on one node, what each loses in milli-GPU, and the links between them.

    bottleneck and total are None for single-GPU placements, which have no links to rate.
    """

    gpus: tuple[int, ...]
    milli_each: int
    bottleneck: int | None = None
    total: int | None = None

    @property
    def annotation(self) -> str:
        return ",".join(str(gpu) for gpu in self.gpus)


@lru_cache(maxsize=65536)
def best_gpu_set(topology: Topology, free: tuple[int, ...], count: int) -> Placement:
    """Best `count` GPUs out of `free` (which must hold at least `count`); cached per machine state.

    Scores each candidate set by (bottleneck, total, links left among the other free GPUs), highest
    first; ties go to the lowest indices so results are reproducible.
    """
    ranks = topology.ranks
    free_links = {i: sum(ranks[i][j] for j in free if j != i) for i in free}
    all_free_links = sum(free_links.values()) // 2
    best_key: tuple[int, int, int] | None = None
    best: tuple[int, ...] = ()
    for chosen in combinations(free, count):
        pair_ranks = [ranks[a][b] for a, b in combinations(chosen, 2)]
        bottleneck = min(pair_ranks, default=0)
        total = sum(pair_ranks)
        # Links among the GPUs left free: all free links, minus those touching the chosen set.
        left = all_free_links - sum(free_links[i] for i in chosen) + total
        key = (bottleneck, total, left)
        if best_key is None or key > best_key:
            best_key, best = key, chosen
    if count < 2:
        return Placement(best, MILLI_PER_GPU)
    assert best_key is not None
    return Placement(best, MILLI_PER_GPU, best_key[0], best_key[1])


class NodeGpus:
    """The GPUs of one node and how much of each (in milli-GPU) is taken; with the CPU (milli-cores)
    and memory (MiB) left, where whoever built it knows them (None otherwise)."""

    __slots__ = ("capacity", "cpu_left", "memory_left", "model", "name", "topology", "used")

    def __init__(self, name: str, topology: Topology, model: str = "",
                 cpu_left: int | None = None, memory_left: int | None = None) -> None:
        self.name = name
        self.topology = topology
        self.model = model
        self.capacity = topology.gpu_count
        self.used = [0] * self.capacity
        self.cpu_left = cpu_left
        self.memory_left = memory_left

    def free_gpus(self) -> tuple[int, ...]:
        return tuple(i for i, used in enumerate(self.used) if used == 0)

    def free_count(self) -> int:
        return self.used.count(0)

    def used_milli(self) -> int:
        return sum(self.used)

    def best_shared_gpu(self, milli: int) -> int | None:
        """Best-fit GPU for a share: the partly used GPU with the least room that still fits."""
        partly_used = [(MILLI_PER_GPU - used, i) for i, used in enumerate(self.used)
                       if used > 0 and used + milli <= MILLI_PER_GPU]
        return min(partly_used)[1] if partly_used else None

    def rejection(self, request: GpuRequest) -> str | None:
        """Why this node cannot take the request right now, or None when it can."""
        if request.is_shared:
            if self.best_shared_gpu(request.milli) is None and not self.free_count():
                return f"no GPU has {request.milli} milli-GPU free"
            return None
        free = self.free_count()
        if free < request.gpus:
            return f"only {free} of {self.capacity} GPUs free, pod asks {request.gpus}"
        return None

    def choose(self, request: GpuRequest) -> Placement | None:
        if request.is_shared:
            shared = self.best_shared_gpu(request.milli)
            if shared is not None:
                return Placement((shared,), request.milli)
            return self.share_on(MILLI_PER_GPU, request.milli)
        free = self.free_gpus()
        if len(free) < request.gpus or not request.gpus:
            return None
        return best_gpu_set(self.topology, free, request.gpus)

    def share_on(self, room: int, milli: int) -> Placement | None:
        """A share on a GPU with exactly `room` milli-GPU left (None when none has): the lowest
        such index, or among free GPUs the worst-connected, so well-linked ones stay together."""
        if room < milli:
            return None
        if room == MILLI_PER_GPU:
            free = self.free_gpus()
            return Placement(best_gpu_set(self.topology, free, 1).gpus, milli) if free else None
        gpu = next((i for i, used in enumerate(self.used) if MILLI_PER_GPU - used == room), None)
        return None if gpu is None else Placement((gpu,), milli)

    def apply(self, placement: Placement) -> None:
        for gpu in placement.gpus:
            if self.used[gpu] + placement.milli_each > MILLI_PER_GPU:
                raise ValueError(f"GPU{gpu} on {self.name} is already taken")
        for gpu in placement.gpus:
            self.used[gpu] += placement.milli_each

    def release(self, placement: Placement) -> None:
        for gpu in placement.gpus:
            self.used[gpu] = max(0, self.used[gpu] - placement.milli_each)
