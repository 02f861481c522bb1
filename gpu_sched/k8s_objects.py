"""What a pod asks for and what a node has, read from their Kubernetes JSON.

Works on plain dicts in the API's own JSON shape, which is what both kube-scheduler (in extender
requests) and the API server (in list/get responses) send, so one reader serves both. Quantities
("7500m", "64", "128Gi", "1e3") are read by the kubernetes client's own parser. CPU is kept in
milli-cores and memory in MiB, the units of the trace and the simulator: a pod's ask is rounded up
and a node's allocatable down, so rounding never invents room.

Names, all documented in gpu_sched/README.md:
  nvidia.com/gpu          resource: whole GPUs (container requests, or limits when no request)
  gpu-sched/gpu-milli     resource: a share of one GPU, 1-999
  gpu-sched/gpu-spec      pod annotation: accepted GPU models, "V100M16|V100M32"
  gpu-sched/group         pod label: quota group
  gpu-sched/gpus          pod annotation written at bind: chosen GPU indices, "0,1"
  gpu-sched/topology      node annotation written by the agent: links between GPUs (JSON)
  gpu-sched/model, nvidia.com/gpu.product   node labels: GPU model (the first one present)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from gpu_sched.allocation import GpuRequest, RequestError
from gpu_sched.locality import cached_bytes
from gpu_sched.topology import Topology, TopologyError, single_socket_pcie

GPU_RESOURCE = "nvidia.com/gpu"
CPU_RESOURCE = "cpu"
MEMORY_RESOURCE = "memory"
MIB = 2**20
MILLI_RESOURCE = "gpu-sched/gpu-milli"
GPU_SPEC_ANNOTATION = "gpu-sched/gpu-spec"
GROUP_LABEL = "gpu-sched/group"
GPUS_ANNOTATION = "gpu-sched/gpus"
TOPOLOGY_ANNOTATION = "gpu-sched/topology"
MODEL_LABELS = ("gpu-sched/model", "nvidia.com/gpu.product")

log = logging.getLogger(__name__)


class ObjectError(ValueError):
    """A pod or node whose JSON does not say something usable."""


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ObjectError(f"{what} must be an object")
    return value


def _quantity(value: Any, what: str) -> Decimal:
    """A non-negative Kubernetes quantity: 2, "2", "500m", "16Gi", "1e3"."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ObjectError(f"{what} must be a Kubernetes quantity such as 500m, 4 or 16Gi, "
                          f"got {value!r}")
    try:
        amount = parse_quantity(value.strip() if isinstance(value, str) else value)
    except ValueError:
        amount = None
    if amount is None or not amount.is_finite() or amount < 0:
        raise ObjectError(f"{what} must be a Kubernetes quantity such as 500m, 4 or 16Gi, "
                          f"got {value!r}")
    return amount


def parse_count(value: Any, what: str) -> int:
    """A whole-number resource quantity: 2, "2", or "2000m"."""
    try:
        amount = _quantity(value, what)
    except ObjectError:
        amount = None
    if amount is None or amount != amount.to_integral_value():
        raise ObjectError(f"{what} must be a whole number, got {value!r}")
    return int(amount)


def _milli_up(value: Any, what: str) -> int:
    return math.ceil(_quantity(value, what) * 1000)


def _mebibytes_up(value: Any, what: str) -> int:
    return math.ceil(_quantity(value, what) / MIB)


def _container_amount(container: dict[str, Any], resource: str,
                      parse: Callable[[Any, str], int]) -> int:
    resources = _mapping(container.get("resources"), "container resources")
    requests = _mapping(resources.get("requests"), "resources.requests")
    limits = _mapping(resources.get("limits"), "resources.limits")
    if resource in requests:
        return parse(requests[resource], resource)
    if resource in limits:
        return parse(limits[resource], resource)
    return 0


def _pod_amount(spec: dict[str, Any], resource: str,
                parse: Callable[[Any, str], int] = parse_count) -> int:
    """Kubernetes' effective request, as kube-scheduler computes it.

    App containers add up; init containers run one at a time, each next to the sidecars
    (init containers with restartPolicy Always) started before it, and sidecars keep running
    beside the app containers; pod overhead (spec.overhead) comes on top.
    """
    def containers(key: str) -> list[dict[str, Any]]:
        value = spec.get(key) or []
        if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
            raise ObjectError(f"spec.{key} must be a list of objects")
        return value

    app = sum(_container_amount(c, resource, parse) for c in containers("containers"))
    sidecars = init = 0
    for container in containers("initContainers"):
        amount = _container_amount(container, resource, parse)
        if container.get("restartPolicy") == "Always":
            sidecars += amount
            init = max(init, sidecars)
        else:
            init = max(init, amount + sidecars)
    overhead = _mapping(spec.get("overhead"), "spec.overhead")
    extra = parse(overhead[resource], f"spec.overhead.{resource}") if resource in overhead else 0
    return max(app + sidecars, init) + extra


def pod_cpu_memory(pod: dict[str, Any]) -> tuple[int, int]:
    """The pod's effective CPU request in milli-cores and memory request in MiB."""
    spec = _mapping(pod.get("spec"), "pod spec")
    return (_pod_amount(spec, CPU_RESOURCE, _milli_up),
            _pod_amount(spec, MEMORY_RESOURCE, _mebibytes_up))


def pod_metadata(pod: dict[str, Any]) -> dict[str, Any]:
    return _mapping(pod.get("metadata"), "pod metadata")


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod_metadata(pod)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("pod has no metadata.name")
    return f"{meta.get('namespace') or 'default'}/{name}"


def pod_group(pod: dict[str, Any]) -> str | None:
    group = _mapping(pod_metadata(pod).get("labels"), "pod labels").get(GROUP_LABEL)
    return group if isinstance(group, str) and group else None


def pod_request(pod: dict[str, Any]) -> GpuRequest:
    if not isinstance(pod, dict):
        raise ObjectError("pod must be an object")
    spec = _mapping(pod.get("spec"), "pod spec")
    gpus = _pod_amount(spec, GPU_RESOURCE)
    milli = _pod_amount(spec, MILLI_RESOURCE)
    annotations = _mapping(pod_metadata(pod).get("annotations"), "pod annotations")
    spec_text = annotations.get(GPU_SPEC_ANNOTATION) or ""
    models = frozenset(m.strip() for m in str(spec_text).split("|") if m.strip())
    cpu, memory = pod_cpu_memory(pod)
    try:
        return GpuRequest(gpus=gpus, milli=milli, models=models, cpu=cpu, memory=memory)
    except RequestError as exc:
        raise ObjectError(f"{exc} ({GPU_RESOURCE} for whole GPUs, {MILLI_RESOURCE} for a share)"
                          ) from exc


def pod_assigned_gpus(pod: dict[str, Any]) -> tuple[int, ...] | None:
    """GPU indices recorded at bind time, or None when the pod has none (or an unreadable one)."""
    annotations = _mapping(pod_metadata(pod).get("annotations"), "pod annotations")
    text = annotations.get(GPUS_ANNOTATION)
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        gpus = tuple(int(part) for part in text.split(","))
    except ValueError:
        log.warning("pod %s: ignoring unreadable %s=%r", pod_key(pod), GPUS_ANNOTATION, text)
        return None
    return gpus if all(gpu >= 0 for gpu in gpus) else None


@dataclass(frozen=True)
class NodeInfo:
    """Inventory of one node: GPUs, CPU and memory from allocatable, links from the agent's
    annotation."""

    name: str
    model: str
    topology: Topology
    cached: dict[str, int] = field(default_factory=dict)
    """Bytes the node's avafs caches hold per volume source (see locality.py)."""
    cpu: int | None = None
    """Allocatable milli-CPU; None when the node reports none."""
    memory: int | None = None
    """Allocatable memory in MiB; None when the node reports none."""


def node_name(node: Any) -> str:
    if not isinstance(node, dict):
        raise ObjectError("node must be an object")
    name = _mapping(node.get("metadata"), "node metadata").get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("node has no metadata.name")
    return name


def node_info(node: dict[str, Any]) -> NodeInfo:
    name = node_name(node)
    meta = _mapping(node.get("metadata"), "node metadata")
    status = _mapping(node.get("status"), "node status")
    allocatable = _mapping(status.get("allocatable"), "status.allocatable")
    capacity = parse_count(allocatable.get(GPU_RESOURCE, 0), f"node {name} {GPU_RESOURCE}")
    labels = _mapping(meta.get("labels"), "node labels")
    model = next((str(labels[key]) for key in MODEL_LABELS if labels.get(key)), "")
    annotations = _mapping(meta.get("annotations"), "node annotations")
    cpu = allocatable.get(CPU_RESOURCE)
    memory = allocatable.get(MEMORY_RESOURCE)
    return NodeInfo(name, model, _node_topology(name, capacity, annotations.get(TOPOLOGY_ANNOTATION)),
                    cached_bytes(annotations),
                    None if cpu is None else int(_quantity(cpu, f"node {name} cpu") * 1000),
                    None if memory is None else int(_quantity(memory, f"node {name} memory") / MIB))


def _node_topology(name: str, capacity: int, annotation: Any) -> Topology:
    """The published topology when it matches allocatable; otherwise one socket over PCIe.

    A mismatch means the device plugin withheld a GPU (unhealthy) and we cannot tell which index,
    so the published links cannot be trusted for this node until the agent republishes.
    """
    if not isinstance(annotation, str):
        return single_socket_pcie(capacity)
    try:
        topology = Topology.from_annotation(annotation)
    except TopologyError as exc:
        log.warning("node %s: ignoring %s: %s", name, TOPOLOGY_ANNOTATION, exc)
        return single_socket_pcie(capacity)
    if topology.gpu_count != capacity:
        log.warning("node %s: %s lists %d GPUs but %d are allocatable; assuming PCIe links",
                    name, TOPOLOGY_ANNOTATION, topology.gpu_count, capacity)
        return single_socket_pcie(capacity)
    return topology
