"""The arrival experiment as deployed: kube-scheduler, as shipped, in front of the extender's code.

The arrival simulator (arrival.py) lets the policy pick any node of the whole cluster, knowing the
workload's pod mix. Deployed, a pod goes through kube-scheduler's scheduling cycle instead, and
this module replays that cycle for each arriving pod:

1. Filter. kube-scheduler's NodeResourcesFit keeps the nodes with the pod's CPU, memory and
   `nvidia.com/gpu` count left (it counts whole GPUs only: a share asks for a resource the
   scheduler configuration tells it to ignore). It walks the nodes from where the previous cycle
   stopped and stops once it has `nodes_to_find` fitting ones (`percentageOfNodesToScore`,
   adaptive when unset); the next cycle starts after the last node it examined.
2. The extender's /filter, on that sample, for pods asking for a resource the configuration's
   `managedResources` lists: `placement.feasible_nodes`, as `Extender.filter` calls it (model,
   GPU room, shares), and every node for a CPU-only pod. When no sampled node survives, the pod
   is retried at once on the next sample, until the whole cluster has been walked; then it fails.
3. Score, unless one node is left: NodeResourcesFit's LeastAllocated and
   NodeResourcesBalancedAllocation over CPU and memory, weight 1 each, plus the extender's
   /prioritize score (`Policy.scores`, 0-10) times the configured weight times 10
   (MaxNodeScore / MaxExtenderPriority). The highest total wins; ties go to a node drawn
   uniformly, as kube-scheduler's selectHost does.
4. Bind: `Policy.place` picks the node's GPUs, as `Extender.bind` does.

The extender's view of a node (GPU use, CPU and memory left) is exactly the cluster's, as after a
resync. Every other default scorer (taints, affinities, topology spread, image locality) gives
the trace's pods the same score on every node, so they are left out.

The fgd policy learns the pod mix as the deployed extender does (`Extender._learn`), each pod once
under its own key (its arrival number), unless warmed with the workload's mix: from every pod
kube-scheduler sends to /filter (a pod some node has CPU, memory and GPU count for), and from
every pod its periodic resync lists, bound or pending. A pod that kube-scheduler's own filter
stops fits nowhere and fails, and in a cluster it would stay pending: the extender sees it at its
next resync. The trace has no clock, so the resync is modelled by arrivals: every
`RESYNC_ARRIVALS` arrivals the extender learns the pods that arrived since the last one (the
30 s default at some 3 pods a second). Pods kube-scheduler retries are not modelled (a pod fails
once its walk of the whole cluster finds no node), so no pod reaches the extender twice here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gpu_sched.allocation import GpuRequest, NodeGpus, Placement
from gpu_sched.arrival import Workload
from gpu_sched.fragmentation import Shape
from gpu_sched.k8s_objects import GPU_RESOURCE, MILLI_RESOURCE
from gpu_sched.placement import feasible_nodes
from gpu_sched.policies import MAX_SCORE, FgdPolicy, Policy, RandomPolicy, make_policy
from gpu_sched.topology import dual_socket_pcie
from gpu_sched.trace import TraceNode, TracePod

SCHEDULER_CONFIG = Path(__file__).parent / "deploy" / "scheduler-config.yaml"
MAX_NODE_SCORE = 100
"""kube-scheduler's framework.MaxNodeScore; extender scores (0 to MAX_SCORE) are scaled to it."""
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5
ADAPTIVE_BASE_PERCENT = 50
ADAPTIVE_NODES_PER_PERCENT = 125
DEFAULT_CPU_MILLI = 100
DEFAULT_MEMORY_BYTES = 200 * 1024 * 1024
"""What LeastAllocated counts for a pod that requests no CPU or memory (schedutil's non-zero)."""
MIB = 1024 * 1024
RESYNC_ARRIVALS = 100
"""Arrivals between two of the extender's resyncs (see the module docstring)."""
DEPLOYED_POLICIES = ("fgd", "binpack", "spread", "random", "fgd-warm")
"""Extender policies to run behind the emulation; fgd-warm is fgd knowing the workload's mix."""


class ConfigError(ValueError):
    """A scheduler configuration this emulation cannot read."""


@dataclass(frozen=True)
class SchedulerConfig:
    """What the emulation takes from a KubeSchedulerConfiguration with one extender."""

    extender_weight: int
    managed: frozenset[str]
    percentage_of_nodes_to_score: int = 0

    @classmethod
    def load(cls, path: Path = SCHEDULER_CONFIG) -> SchedulerConfig:
        document = yaml.safe_load(path.read_text())
        extenders = document.get("extenders") or []
        if len(extenders) != 1:
            raise ConfigError(f"{path}: expected one extender, found {len(extenders)}")
        extender = extenders[0]
        managed = frozenset(entry["name"] for entry in extender.get("managedResources") or [])
        return cls(int(extender.get("weight", 1)), managed,
                   int(document.get("percentageOfNodesToScore") or 0))

    def sends(self, request: GpuRequest) -> bool:
        """Whether kube-scheduler hands the pod to the extender: it asks for a managed resource."""
        asked = {"cpu": request.cpu > 0, "memory": request.memory > 0,
                 GPU_RESOURCE: request.gpus > 0, MILLI_RESOURCE: request.is_shared}
        return any(asked.get(name, False) for name in self.managed)


def nodes_to_find(total: int, percentage: int = 0) -> int:
    """How many fitting nodes kube-scheduler looks for before it stops filtering (its
    numFeasibleNodesToFind): all below 100 nodes; else `percentage` of them, or when unset
    50% less one point per 125 nodes, at least 5%; never fewer than 100."""
    if total < MIN_FEASIBLE_NODES or percentage >= 100:
        return total
    if percentage <= 0:
        percentage = max(ADAPTIVE_BASE_PERCENT - total // ADAPTIVE_NODES_PER_PERCENT,
                         MIN_FEASIBLE_PERCENT)
    return max(total * percentage // 100, MIN_FEASIBLE_NODES)


class NodeSampler:
    """kube-scheduler's walk over the nodes: each cycle starts where the previous one stopped."""

    def __init__(self, count: int, percentage: int = 0) -> None:
        self.count = count
        self.wanted = nodes_to_find(count, percentage)
        self.next_start = 0

    def sample(self, fits: np.ndarray) -> tuple[np.ndarray, int]:
        """Indices of the fitting nodes examined this cycle, in walk order, and how many nodes
        were examined (fitting or not)."""
        order = (self.next_start + np.arange(self.count)) % self.count
        passing = fits[order]
        found = np.cumsum(passing)
        examined = self.count
        if found[-1] > self.wanted:
            examined = int(np.searchsorted(found, self.wanted)) + 1
        self.next_start = (self.next_start + examined) % self.count
        return order[:examined][passing[:examined]], examined


def least_allocated(requested: np.ndarray, allocatable: np.ndarray) -> np.ndarray:
    """NodeResourcesFit's LeastAllocated score per node (columns) over resources (rows) of
    weight 1: per resource (free after the pod x 100) // allocatable, 0 when over; their mean,
    rounded down. Resources a node has none of are left out."""
    has = allocatable > 0
    safe = np.where(has, allocatable, 1)
    per = np.where(requested > allocatable, 0, (allocatable - requested) * MAX_NODE_SCORE // safe)
    counted = has.sum(axis=0)
    return np.where(counted > 0, (per * has).sum(axis=0) // np.maximum(counted, 1), 0)


def balanced_allocation(requested: np.ndarray, allocatable: np.ndarray) -> np.ndarray:
    """NodeResourcesBalancedAllocation's score per node for two resources (rows): the used
    fractions after the pod, each at most 1, and (1 - |difference| / 2) x 100 rounded down."""
    fraction = np.minimum(requested / np.where(allocatable > 0, allocatable, 1), 1.0)
    deviation = np.abs(fraction[0] - fraction[1]) / 2
    return ((1 - deviation) * MAX_NODE_SCORE).astype(np.int64)


class KubeScheduler:
    """kube-scheduler's cycle (see the module docstring) over trace nodes, in name order, with
    the extender's policy; it keeps the nodes' books as pods are bound.

    The extender's answers for a node depend only on the node's state (model, GPUs and their
    use, CPU and memory left) and on the candidates' best: filter is per node, and a policy's
    score is per node but for the one node it would choose, the first name among equals. So,
    unless `exact`, the extender is asked about the first two names of each state among the
    candidates, and every other node of a state takes the second's answer; the random policy,
    whose answers are draws, is always asked about every node. Both ways give the same
    placements (tests/gpu_sched/test_deployed.py); this one costs a fraction, as a filling
    cluster has far fewer states than nodes.
    """

    def __init__(self, nodes: list[TraceNode], policy: Policy, config: SchedulerConfig,
                 rng: np.random.Generator, exact: bool = False,
                 resync_arrivals: int = RESYNC_ARRIVALS) -> None:
        nodes = sorted(nodes, key=lambda node: node.sn)
        self.policy = policy
        self.resync_arrivals = resync_arrivals
        self.unlisted: list[tuple[str, GpuRequest]] = []
        """Pods arrived since the extender's last resync, which lists them."""
        self.config = config
        self.rng = rng
        self.exact = exact or isinstance(policy, RandomPolicy)
        self.extender_factor = config.extender_weight * (MAX_NODE_SCORE // MAX_SCORE)
        self.nodes = [NodeGpus(node.sn, dual_socket_pcie(node.gpu), node.model, node.cpu_milli,
                               node.memory_mib) for node in nodes]
        self.index = {node.name: index for index, node in enumerate(self.nodes)}
        self._state_ids: dict[tuple[Any, ...], int] = {}
        self.state = np.array([self._state_of(node) for node in self.nodes], dtype=np.int64)
        """Equal numbers for nodes in equal states, as the extender sees them."""
        self.allocatable = np.array([[node.cpu_milli for node in nodes],
                                     [node.memory_mib * MIB for node in nodes]], dtype=np.int64)
        self.requested = np.zeros_like(self.allocatable)
        self.nonzero_requested = np.zeros_like(self.allocatable)
        self.gpus_left = np.array([node.gpu for node in nodes], dtype=np.int64)
        """Whole GPUs kube-scheduler counts free: allocatable nvidia.com/gpu less the requests."""
        self.sampler = NodeSampler(len(nodes), config.percentage_of_nodes_to_score)

    def _state_of(self, node: NodeGpus) -> int:
        key = (node.model, node.capacity, tuple(node.used), node.cpu_left, node.memory_left)
        return self._state_ids.setdefault(key, len(self._state_ids))

    @staticmethod
    def _asks(request: GpuRequest) -> tuple[np.ndarray, np.ndarray]:
        """The pod's CPU and memory as requested and as LeastAllocated counts them."""
        asked = np.array([request.cpu, request.memory * MIB], dtype=np.int64)
        nonzero = np.array([request.cpu or DEFAULT_CPU_MILLI,
                            request.memory * MIB or DEFAULT_MEMORY_BYTES], dtype=np.int64)
        return asked, nonzero

    def kube_fits(self, request: GpuRequest) -> np.ndarray:
        """NodeResourcesFit's filter: CPU, memory and nvidia.com/gpu left on every node."""
        asked, _ = self._asks(request)
        left = self.allocatable - self.requested
        return (left >= asked[:, None]).all(axis=0) & (self.gpus_left >= request.gpus)

    def _shown(self, candidates: np.ndarray, per_state: int) -> tuple[np.ndarray, np.ndarray]:
        """The candidates to ask the extender about (the first `per_state` names of each state,
        or all when exact), in name order, and for each candidate the one whose answer it takes."""
        if self.exact:
            return np.sort(candidates), candidates
        order = np.lexsort((candidates, self.state[candidates]))
        by_state = self.state[candidates][order]
        starts_group = np.ones(len(order), dtype=bool)
        starts_group[1:] = by_state[1:] != by_state[:-1]
        starts = np.flatnonzero(starts_group)
        group = np.cumsum(starts_group) - 1
        rank = np.arange(len(order)) - starts[group]
        sizes = np.diff(np.append(starts, len(order)))
        ordered = candidates[order]
        last_shown = ordered[starts + np.minimum(sizes, per_state) - 1]
        stand_in = np.empty_like(candidates)
        stand_in[order] = np.where(rank < per_state, ordered, last_shown[group])
        return np.sort(ordered[rank < per_state]), stand_in

    def extender_filter(self, request: GpuRequest, candidates: np.ndarray) -> np.ndarray:
        """The candidates the extender's /filter keeps."""
        if not (request.wants_gpu and self.config.sends(request)):
            return candidates
        shown, stand_in = self._shown(candidates, 1)
        fits, _ = feasible_nodes(request, [self.nodes[i] for i in shown])
        kept = np.zeros(len(self.nodes), dtype=bool)
        kept[[self.index[node.name] for node in fits]] = True
        return candidates[kept[stand_in]]

    def scores(self, request: GpuRequest, candidates: np.ndarray) -> np.ndarray:
        """Each candidate's total: the in-tree scorers plus the extender's scaled score."""
        asked, nonzero = self._asks(request)
        total = least_allocated(self.nonzero_requested[:, candidates] + nonzero[:, None],
                                self.allocatable[:, candidates])
        total = total + balanced_allocation(self.requested[:, candidates] + asked[:, None],
                                            self.allocatable[:, candidates])
        if self.config.sends(request):
            shown, stand_in = self._shown(candidates, 2)
            extender = self.policy.scores(request, [self.nodes[i] for i in shown])
            answer = np.zeros(len(self.nodes), dtype=np.int64)
            answer[shown] = [extender.get(self.nodes[i].name, 0) for i in shown]
            total = total + self.extender_factor * answer[stand_in]
        return total

    def resync(self) -> None:
        """The extender's periodic listing: it learns every pod it lists (bound or pending)."""
        for key, request in self.unlisted:
            if self.config.sends(request):
                self.policy.learn(key, request)
        self.unlisted.clear()

    def schedule(self, request: GpuRequest, key: str) -> tuple[int, Placement] | None:
        """The node and GPUs the pod (`key` names it) is bound to, recorded in the books; None
        when it fits nowhere kube-scheduler's walk and the extender's filter let it."""
        if len(self.unlisted) >= self.resync_arrivals:
            self.resync()
        self.unlisted.append((key, request))
        kube_fits = self.kube_fits(request)
        if not kube_fits.any():
            return None
        if self.config.sends(request):
            self.policy.learn(key, request)
        walked = 0
        while walked < len(self.nodes):
            sampled, examined = self.sampler.sample(kube_fits)
            walked += examined
            candidates = self.extender_filter(request, sampled)
            if len(candidates):
                break
        else:
            return None
        if len(candidates) == 1:
            chosen = int(candidates[0])
        else:
            total = self.scores(request, candidates)
            best = np.flatnonzero(total == total.max())
            chosen = int(candidates[best[self.rng.integers(len(best))]])
        node = self.nodes[chosen]
        placement = Placement((), 0)
        if request.wants_gpu:
            placement = self.policy.place(node, request)
            if placement is None:
                raise RuntimeError(f"{node.name} passed the extender's filter but cannot take "
                                   f"{request}")
        self._bind(chosen, request, placement)
        return chosen, placement

    def _bind(self, index: int, request: GpuRequest, placement: Placement) -> None:
        node = self.nodes[index]
        node.apply(placement)
        asked, nonzero = self._asks(request)
        self.requested[:, index] += asked
        self.nonzero_requested[:, index] += nonzero
        self.gpus_left[index] -= request.gpus
        left = self.allocatable[:, index] - self.requested[:, index]
        node.cpu_left, node.memory_left = int(left[0]), int(left[1] // MIB)
        self.state[index] = self._state_of(node)


def deployed_policy(name: str, shapes: list[Shape], seed: int) -> Policy:
    """The extender's policy of that name; fgd-warm is fgd that has seen the workload's pods."""
    if name == "fgd-warm":
        return FgdPolicy(known=shapes)
    return make_policy(name, seed)


def run_deployed(nodes: list[TraceNode], pods: list[TracePod], policy: str,
                 demand: float = 1.3, seed: int = 0, config: SchedulerConfig | None = None,
                 exact: bool = False, resync_arrivals: int = RESYNC_ARRIVALS) -> dict[str, Any]:
    """One run of the arrival experiment (same arrivals and figures as arrival.run_arrival for
    the seed) with every pod placed through the kube-scheduler emulation."""
    if policy not in DEPLOYED_POLICIES:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(DEPLOYED_POLICIES)})")
    workload = Workload(nodes, pods, demand, seed)
    scheduler = KubeScheduler(nodes, deployed_policy(policy, workload.shapes, seed),
                              config or SchedulerConfig.load(), workload.rng, exact,
                              resync_arrivals)
    requests = [pod.request() for pod in workload.pods]
    arrivals = itertools.count()

    def place(index: int, _: Shape) -> tuple[int, list[int]] | None:
        bound = scheduler.schedule(requests[index], str(next(arrivals)))
        return None if bound is None else (bound[0], list(bound[1].gpus))

    return workload.measure(place, lambda _: None, {"mode": "deployed", "policy": policy})
