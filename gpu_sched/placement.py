"""Which nodes can take a request at all, and why the others cannot.

Reasons are written for the pod's owner: kube-scheduler copies them into the pod's events. A
rejection is "unresolvable" when evicting other pods from the node would not help (wrong GPU model,
too few GPUs in the machine), so kube-scheduler does not try preemption for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_sched.allocation import GpuRequest, NodeGpus


@dataclass(frozen=True)
class Rejection:
    reason: str
    unresolvable: bool


def rejection(node: NodeGpus, request: GpuRequest) -> Rejection | None:
    if not request.accepts_model(node.model):
        wanted = "|".join(sorted(request.models))
        model = node.model or "unknown"
        return Rejection(f"GPU model {model} is not one of {wanted}", True)
    if not node.capacity:
        return Rejection("node has no GPUs", True)
    if request.gpus > node.capacity:
        return Rejection(f"node has {node.capacity} GPUs, pod asks {request.gpus}", True)
    reason = node.rejection(request)
    return Rejection(reason, False) if reason else None


def feasible_nodes(request: GpuRequest, nodes: Iterable[NodeGpus]
                   ) -> tuple[list[NodeGpus], dict[str, Rejection]]:
    """Split nodes into those that fit the request now and the rejected ones with their reasons."""
    fits: list[NodeGpus] = []
    rejected: dict[str, Rejection] = {}
    for node in nodes:
        why = rejection(node, request)
        if why is None:
            fits.append(node)
        else:
            rejected[node.name] = why
    return fits, rejected
