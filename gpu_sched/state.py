"""The extender's memory of what each pod holds on its node: GPUs, CPU and memory.

The authoritative copy lives in the API server: each bound pod's gpu-sched/gpus annotation names
its GPUs, and its containers' requests its CPU and memory. This ledger is a cache of it, rebuilt
from a pod listing at start and refreshed periodically so deleted and finished pods give their
share back; a bind records the pod's share at once, before the next listing can see it. Every
method takes the lock, so the HTTP server's threads can share one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpu_sched.allocation import MILLI_PER_GPU, NodeGpus
from gpu_sched.k8s_objects import (
    NodeInfo,
    ObjectError,
    pod_assigned_gpus,
    pod_cpu_memory,
    pod_group,
    pod_key,
    pod_request,
)
from gpu_sched.quota import QuotaBook

log = logging.getLogger(__name__)

FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Assignment:
    """What one bound pod holds on its node; gpus is empty for a pod holding none we can name."""

    pod_key: str
    uid: str
    node: str
    gpus: tuple[int, ...]
    milli_each: int
    group_label: str | None
    gpu_equivalent: float
    settled_at: float | None = None
    """When the API server was known to hold this (bind done, or seen listed); None while binding."""
    cpu: int = 0
    """Requested milli-CPU."""
    memory: int = 0
    """Requested MiB."""


def assignment_from_pod(pod: dict[str, Any]) -> Assignment | None:
    """What a listed pod holds: CPU and memory for every bound, unfinished pod, and the GPUs its
    gpu-sched/gpus annotation names; None for a pod that is unbound or finished."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    phase = status.get("phase") if isinstance(status, dict) else None
    if not node or phase in FINISHED_PHASES:
        return None
    key = pod_key(pod)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    try:
        cpu, memory = pod_cpu_memory(pod)
    except ObjectError as exc:
        log.warning("pod %s: not counting its CPU and memory: %s", key, exc)
        cpu = memory = 0
    held = Assignment(key, uid, node, (), 0, pod_group(pod), 0.0, settled_at=time.monotonic(),
                      cpu=cpu, memory=memory)
    gpus = pod_assigned_gpus(pod)
    if gpus is None:
        return held
    try:
        request = pod_request(pod)
    except ObjectError as exc:
        log.warning("pod %s: not counting its GPUs: %s", key, exc)
        return held
    if not request.wants_gpu:
        return held
    milli_each = request.milli if request.is_shared else MILLI_PER_GPU
    return Assignment(key, uid, node, gpus, milli_each, held.group_label, request.gpu_equivalent,
                      held.settled_at, cpu, memory)


class Ledger:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_node: dict[str, dict[str, Assignment]] = {}
        self._by_pod: dict[str, Assignment] = {}

    @property
    def lock(self) -> threading.RLock:
        """Held across check-then-record in bind, so two binds cannot take the same GPU."""
        return self._lock

    def node_gpus(self, info: NodeInfo, exclude_pod: str | None = None) -> NodeGpus:
        """The node as the pods in the ledger leave it, but for `exclude_pod`: its GPUs' use, and
        its CPU and memory left where the node reports allocatable amounts."""
        with self._lock:
            held = [a for a in self._by_node.get(info.name, {}).values()
                    if a.pod_key != exclude_pod]
        node = NodeGpus(info.name, info.topology, info.model,
                        None if info.cpu is None else info.cpu - sum(a.cpu for a in held),
                        None if info.memory is None else info.memory - sum(a.memory for a in held))
        for assignment in held:
            for gpu in assignment.gpus:
                if gpu < node.capacity:
                    node.used[gpu] = min(MILLI_PER_GPU, node.used[gpu] + assignment.milli_each)
                else:
                    log.warning("pod %s holds GPU%d but node %s has %d GPUs", assignment.pod_key,
                                gpu, info.name, node.capacity)
        return node

    def group_usage(self, quota: QuotaBook, group: str, exclude_pod: str | None = None) -> float:
        with self._lock:
            held = list(self._by_pod.values())
        return sum(a.gpu_equivalent for a in held
                   if a.pod_key != exclude_pod and quota.accounting_group(a.group_label) == group)

    def get(self, key: str) -> Assignment | None:
        with self._lock:
            return self._by_pod.get(key)

    def record(self, assignment: Assignment) -> None:
        with self._lock:
            self.release(assignment.pod_key)
            self._by_pod[assignment.pod_key] = assignment
            self._by_node.setdefault(assignment.node, {})[assignment.pod_key] = assignment

    def release(self, key: str, only: Assignment | None = None) -> None:
        """Forget a pod's GPUs; with `only`, just when that is still the pod's assignment."""
        with self._lock:
            current = self._by_pod.get(key)
            if current is None or (only is not None and current is not only):
                return
            del self._by_pod[key]
            on_node = self._by_node.get(current.node, {})
            on_node.pop(key, None)
            if not on_node:
                self._by_node.pop(current.node, None)

    def replace(self, listed: Iterable[Assignment], listing_started: float) -> None:
        """Take a fresh listing as the truth, except for binds it may have missed.

        A bind records its assignment before it patches the pod, so a bind still in flight, or one
        that finished after the listing started, may be absent from the listing without the pod
        being gone; those are kept.
        """
        fresh = {a.pod_key: a for a in listed}
        with self._lock:
            for key, current in self._by_pod.items():
                if key not in fresh and (current.settled_at is None
                                         or current.settled_at >= listing_started):
                    fresh[key] = current
            self._by_pod = {}
            self._by_node = {}
            for assignment in fresh.values():
                self.record(assignment)
