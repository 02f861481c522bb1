"""GPU fragmentation measured against a workload's pod types, and its change when one pod is placed.

A node's free GPU capacity is fragmented for a pod type when that type cannot use it: the node's
GPU model is not one it accepts, it lacks the CPU or memory to host one, it has too few GPUs with
enough room, or (when a pod of the type does fit) the capacity sits on GPUs with less room than
one pod of the type needs. A pod type that asks for no GPU can use no GPU capacity, so for it all
free capacity counts. The node's fragmentation is the sum over types, weighted by how often each
type occurs in the workload:

    F(node) = sum_t p_t * (free(node) - fits_t(node) * usable_t(node))

where usable_t is the free capacity on GPUs with at least the type's milli-GPU share left. This is
the measure of Weng et al. (USENIX ATC 2023), who published the trace; `stranding` is a stricter
one, and the fgd policy places each pod where their weighted sum (`waste`) grows least
("fragmentation gradient descent"), keeping capacity in shapes the pods still to come can use.

Everything is vectorised over nodes with numpy: per type, the count of GPUs with room for it,
the capacity on them and the pods of the type they could take are kept per node (`Aggregates`)
and refreshed only for the node a placement changes, so scoring one pod against every node costs
a few array operations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

MILLI = 1000
EXACT = 1e-6
"""Added before flooring a quotient computed as a product with a reciprocal, so exact multiples
(8000 milli-CPU left, 4000 per pod) are not floored one short by rounding."""
FGD_COVERAGE = 0.9
"""Share of the pods whose shapes the fgd policy weighs (PodTypes' `coverage`), in the extender and
the arrival simulator alike; the rarer shapes are left out. Each of them rests on a few dozen pods,
so in a mix learned from arriving pods which make the cut, and what each weighs, is mostly
sampling noise; and where CPU is short, fgd's choices followed those weights, keeping room for
many rare shapes at the cost of GPUs the common ones would have used (docs/optimization-history.md,
"The pod mix's rare shapes"). `fragmented_gpus`, the paper's measure, keeps PodTypes' default."""
FRAGMENTATION_WEIGHT = 10.0
"""Weight of `fragmentation` against `stranding` in `waste`, chosen on a few seeds of the trace's
default, GPU-sharing and multi-GPU workloads (BENCHMARKS.md)."""


@dataclass(frozen=True)
class Shape:
    """What one pod asks for: CPU (milli-cores), memory (MiB), GPUs and milli-GPU on each GPU.

    models is the set of accepted GPU models, empty for any.
    """

    cpu: int
    memory: int
    gpus: int
    milli: int
    models: frozenset[str] = frozenset()

    @property
    def gpu_milli(self) -> int:
        return self.gpus * self.milli


@lru_cache(maxsize=65536)
def _order(shape: Shape) -> str:
    """A fixed order among shapes equally common, cached: the extender ranks its mix per pod."""
    return repr(shape)


def model_access(models: frozenset[str], node_models: list[str]) -> np.ndarray:
    """Which nodes a shape may use; a node with no model serves only shapes that accept any."""
    if not models:
        return np.ones(len(node_models), dtype=bool)
    return np.array([model in models for model in node_models], dtype=bool)


class PodTypes:
    """The workload's most common shapes and their weights, as fragmentation is measured against.

    The most popular shapes covering `coverage` of the pods are kept (the rare rest would cost
    time and barely move the weights), and the weights renormalised to sum to 1.
    """

    def __init__(self, shapes: Iterable[Shape] | Mapping[Shape, int], node_models: list[str],
                 coverage: float = 0.95, memory: bool = True) -> None:
        """`shapes`: one per pod, or each with its count (cheaper for a large mix)."""
        counted = shapes if isinstance(shapes, Mapping) else Counter(shapes)
        counts: Counter[Shape] = Counter()
        for shape, count in counted.items():
            counts[shape if memory else Shape(shape.cpu, 0, shape.gpus, shape.milli,
                                              shape.models)] += count
        total = sum(counts.values())
        kept: list[tuple[Shape, int]] = []
        covered = 0
        for shape, count in sorted(counts.items(), key=lambda item: (-item[1], _order(item[0]))):
            if total and covered >= coverage * total:
                break
            kept.append((shape, count))
            covered += count
        self.shapes = [shape for shape, _ in kept]
        weights = np.array([count for _, count in kept], dtype=float)
        self.weights = weights / weights.sum() if len(weights) else weights
        gpu = [i for i, shape in enumerate(self.shapes) if shape.gpus > 0]
        self.cpu_only_weight = float(self.weights.sum() - self.weights[gpu].sum())
        self.gpu_weights = self.weights[gpu]
        self.cpu = np.array([self.shapes[i].cpu for i in gpu], dtype=np.int64)
        self.memory = np.array([self.shapes[i].memory for i in gpu], dtype=np.int64)
        self.gpus = np.array([self.shapes[i].gpus for i in gpu], dtype=np.int64)
        self.milli = np.array([self.shapes[i].milli for i in gpu], dtype=np.int64)
        self.access = (np.array([model_access(self.shapes[i].models, node_models) for i in gpu])
                       if gpu else np.zeros((0, len(node_models)), dtype=bool))
        # Reciprocals as columns, so per-candidate divisions become float multiplications.
        self.per_gpu = 1.0 / self.gpus[:, None]
        self.per_cpu = 1.0 / np.maximum(self.cpu, 1)[:, None]
        self.per_memory = 1.0 / np.maximum(self.memory, 1)[:, None]
        self.per_milli = 1.0 / self.milli[:, None]
        self.pod_milli = (self.gpus * self.milli)[:, None].astype(float)


class Aggregates:
    """Per type and node: GPUs with room for one pod of the type, the free milli-GPU on them, and
    how many pods of the type the GPUs alone could take (slots)."""

    def __init__(self, types: PodTypes, gpu_left: np.ndarray) -> None:
        self.types = types
        self.count, self.usable, self.slots = self._compute(gpu_left[None, :, :],
                                                            types.milli[:, None, None])

    @staticmethod
    def _compute(left: np.ndarray, need: np.ndarray) -> tuple[np.ndarray, ...]:
        room = left >= need
        return room.sum(axis=-1), np.where(room, left, 0).sum(axis=-1), (left // need).sum(axis=-1)

    def refresh(self, node: int, gpu_left_row: np.ndarray) -> None:
        count, usable, slots = self._compute(gpu_left_row[None, :], self.types.milli[:, None])
        self.count[:, node], self.usable[:, node], self.slots[:, node] = count, usable, slots


def fragmentation(types: PodTypes, free: np.ndarray, count: np.ndarray, usable: np.ndarray,
                  cpu_left: np.ndarray, memory_left: np.ndarray, access: np.ndarray) -> np.ndarray:
    """F for each column: free is (C,), count/usable/access are (T, C), cpu/memory left (C,)."""
    fits = (access & (count >= types.gpus[:, None]) & (cpu_left[None, :] >= types.cpu[:, None])
            & (memory_left[None, :] >= types.memory[:, None]))
    return free * (types.cpu_only_weight + types.gpu_weights.sum()) \
        - types.gpu_weights @ np.where(fits, usable, 0)


def stranding(types: PodTypes, free: np.ndarray, slots: np.ndarray, cpu_left: np.ndarray,
              memory_left: np.ndarray, access: np.ndarray) -> np.ndarray:
    """Free milli-GPU that filling each column with pods of one type would leave, weighted by type.

    Stricter than `fragmentation`: a node with eight free GPUs but CPU for one more one-GPU pod
    strands seven of them for that type, and a GPU with 900 left strands 400 for 500-shares.
    """
    fill = np.minimum(slots * types.per_gpu, cpu_left[None, :] * types.per_cpu)
    np.minimum(fill, memory_left[None, :] * types.per_memory, out=fill)
    np.floor(fill + EXACT, out=fill)
    fill *= types.pod_milli
    np.minimum(fill, free[None, :], out=fill)
    fill *= access
    return free * (types.cpu_only_weight + types.gpu_weights.sum()) - types.gpu_weights @ fill


def waste(types: PodTypes, free: np.ndarray, count: np.ndarray, usable: np.ndarray,
          slots: np.ndarray, cpu_left: np.ndarray, memory_left: np.ndarray,
          access: np.ndarray) -> np.ndarray:
    """What the fgd policy minimises per column: stranding plus weighted fragmentation.

    Each measure alone misses what the other sees: fragmentation calls a GPU usable for a type
    when one pod fits, however much room would be left over after it; stranding counts that
    left-over room, but weighs a type that fits nowhere on a node no more than the room it
    leaves. Ranking by their sum places more of the workload than either (see BENCHMARKS.md).
    """
    return stranding(types, free, slots, cpu_left, memory_left, access) + FRAGMENTATION_WEIGHT \
        * fragmentation(types, free, count, usable, cpu_left, memory_left, access)


def node_waste(types: PodTypes, aggregates: Aggregates, free: np.ndarray, cpu_left: np.ndarray,
               memory_left: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """`waste` of the given nodes as they are now."""
    return waste(types, free[nodes], aggregates.count[:, nodes], aggregates.usable[:, nodes],
                 aggregates.slots[:, nodes], cpu_left[nodes], memory_left[nodes],
                 types.access[:, nodes])


def placement_delta(types: PodTypes, aggregates: Aggregates, shape: Shape, nodes: np.ndarray,
                    levels: np.ndarray | None, free: np.ndarray, cpu_left: np.ndarray,
                    memory_left: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Growth of `waste` on each candidate: node `nodes[c]`, taking the shape's GPUs.

    Whole GPUs (milli 1000) come off GPUs that are entirely free, which every type has room on,
    so each type loses `gpus` GPUs, 1000 milli-GPU and 1000 // milli slots apiece. A share of one
    GPU comes off a GPU with `levels[c]` milli-GPU left; each type's figures change by that one
    GPU's before and after. `before` holds the current `waste` of every node.
    """
    count = aggregates.count[:, nodes]
    usable = aggregates.usable[:, nodes]
    slots = aggregates.slots[:, nodes]
    if levels is None:
        count = count - shape.gpus
        usable = usable - shape.gpu_milli
        slots = slots - shape.gpus * (MILLI // types.milli)[:, None]
    else:
        need = types.milli[:, None]
        per_milli = types.per_milli
        after = levels - shape.milli
        had, has = levels[None, :] >= need, after[None, :] >= need
        count = count - had + has
        usable = usable - np.where(had, levels[None, :], 0) + np.where(has, after[None, :], 0)
        slots = slots - np.floor(levels[None, :] * per_milli + EXACT) \
            + np.floor(after[None, :] * per_milli + EXACT)
    new = waste(types, free[nodes] - shape.gpu_milli, count, usable, slots,
                cpu_left[nodes] - shape.cpu, memory_left[nodes] - shape.memory,
                types.access[:, nodes])
    return new - before[nodes]
