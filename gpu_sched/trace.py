"""Traces in the CSV format of Alibaba's public GPU cluster trace 2023 (cluster-trace-gpu-v2023).

nodes: sn,cpu_milli,memory_mib,gpu,model
pods:  name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
       deletion_time,scheduled_time
       or only the first five (the trace's multigpu workloads): no model constraint, no times.

A pod with num_gpu 1 and gpu_milli 1-999 shares one GPU; any other pod with num_gpu > 0 takes num_gpu
whole GPUs. gpu_spec lists accepted models ("V100M16|V100M32"; empty or "nan" for any). Times are
seconds; an empty deletion_time means the pod never leaves.

The synthetic generator writes the same format with a workload shaped like the public trace's
(mostly one-GPU and shared pods, a tail of 2-, 4- and 8-GPU jobs), so tests and demos run the same
code path as real traces.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

from gpu_sched.allocation import MILLI_PER_GPU, GpuRequest

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
               "pod_phase", "creation_time", "deletion_time", "scheduled_time")
REQUIRED_POD_COLUMNS = POD_COLUMNS[:5]


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceNode:
    sn: str
    cpu_milli: int
    memory_mib: int
    gpu: int
    model: str


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    qos: str
    pod_phase: str
    creation_time: int | None
    deletion_time: int | None
    scheduled_time: int | None

    def request(self) -> GpuRequest:
        models = frozenset(m for m in self.gpu_spec.split("|") if m and m != "nan")
        if self.num_gpu == 1 and 0 < self.gpu_milli < MILLI_PER_GPU:
            return GpuRequest(milli=self.gpu_milli, models=models, cpu=self.cpu_milli,
                              memory=self.memory_mib)
        return GpuRequest(gpus=self.num_gpu, models=models, cpu=self.cpu_milli,
                          memory=self.memory_mib)


def _rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows as dicts with their line numbers; `columns` must all be present."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected "
                             f"{','.join(columns)}")
        try:
            return [(reader.line_num, row) for row in reader]
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path} line {reader.line_num}: {exc}") from exc


def _integer(path: Path, line: int, row: dict[str, str], column: str,
             optional: bool = False) -> int | None:
    text = (row.get(column) or "").strip()
    if optional and text in ("", "nan"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value) or value < 0:
        raise TraceError(f"{path} line {line}: {column} must be a whole number >= 0, got {text!r}")
    return int(value)


def read_nodes(path: str | Path) -> list[TraceNode]:
    path = Path(path)
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        def number(column: str, line: int = line, row: dict[str, str] = row) -> int:
            return _integer(path, line, row, column) or 0

        sn = (row["sn"] or "").strip()
        if not sn:
            raise TraceError(f"{path} line {line}: sn is empty")
        model = (row["model"] or "").strip()
        nodes.append(TraceNode(sn, number("cpu_milli"), number("memory_mib"), number("gpu"),
                               "" if model == "nan" else model))
    if len({node.sn for node in nodes}) != len(nodes):
        raise TraceError(f"{path}: node names (sn) are not unique")
    return nodes


def read_pods(path: str | Path) -> list[TracePod]:
    """Pods from either layout; absent columns read as empty (any model, no times)."""
    path = Path(path)
    pods = []
    for line, row in _rows(path, REQUIRED_POD_COLUMNS):
        def number(column: str, line: int = line, row: dict[str, str] = row) -> int:
            return _integer(path, line, row, column) or 0

        def maybe(column: str, line: int = line, row: dict[str, str] = row) -> int | None:
            return _integer(path, line, row, column, optional=True)

        gpu_milli = number("gpu_milli")
        if gpu_milli > MILLI_PER_GPU:
            raise TraceError(f"{path} line {line}: gpu_milli must be at most {MILLI_PER_GPU}, "
                             f"got {gpu_milli}")
        name = (row["name"] or "").strip()
        if not name:
            raise TraceError(f"{path} line {line}: name is empty")
        pod = TracePod(name, number("cpu_milli"), number("memory_mib"),
                       number("num_gpu"), gpu_milli, (row.get("gpu_spec") or "").strip(),
                       (row.get("qos") or "").strip(), (row.get("pod_phase") or "").strip(),
                       maybe("creation_time"), maybe("deletion_time"), maybe("scheduled_time"))
        if pod.deletion_time is not None and pod.creation_time is not None \
                and pod.deletion_time < pod.creation_time:
            raise TraceError(f"{path} line {line}: deletion_time {pod.deletion_time} is before "
                             f"creation_time {pod.creation_time}")
        pods.append(pod)
    return pods


def _cell(value: int | str | None) -> str:
    return "" if value is None else str(value)


def write_nodes(path: str | Path, nodes: list[TraceNode]) -> None:
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(NODE_COLUMNS)
        for node in nodes:
            writer.writerow([node.sn, node.cpu_milli, node.memory_mib, node.gpu, node.model])


def write_pods(path: str | Path, pods: list[TracePod]) -> None:
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(POD_COLUMNS)
        for pod in pods:
            writer.writerow([pod.name, pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli,
                             pod.gpu_spec, pod.qos, pod.pod_phase, _cell(pod.creation_time),
                             _cell(pod.deletion_time), _cell(pod.scheduled_time)])


# (GPUs per machine, model, cpu_milli, memory_mib, share of machines)
_MACHINES = ((8, "V100M32", 96000, 786432, 0.5), (4, "V100M16", 32000, 131072, 0.25),
             (2, "T4", 104000, 524288, 0.25))
# (num_gpu, share of pods); 1 is split between whole and shared GPUs below.
_POD_SIZES = ((0, 0.08), (1, 0.70), (2, 0.10), (4, 0.06), (8, 0.06))
_SHARED_SHARE_OF_ONE_GPU = 0.45
_MEAN_DURATION_S = 4 * 3600
_TARGET_LOAD = 0.9


def generate(node_count: int, pod_count: int, seed: int) -> tuple[list[TraceNode], list[TracePod]]:
    """A cluster and a workload that offers about 90% of its GPUs, so placement decides who fits."""
    if node_count < 1 or pod_count < 1:
        raise TraceError("a synthetic trace needs at least one node and one pod")
    rng = random.Random(seed)
    nodes = []
    for index in range(node_count):
        gpus, model, cpu, memory, _ = rng.choices(_MACHINES, [m[4] for m in _MACHINES])[0]
        nodes.append(TraceNode(f"synth-node-{index:04d}", cpu, memory, gpus, model))
    total_gpus = sum(node.gpu for node in nodes)
    sizes = rng.choices([s for s, _ in _POD_SIZES], [w for _, w in _POD_SIZES], k=pod_count)
    shares = [rng.randrange(100, 1000, 50) if size == 1 and rng.random() < _SHARED_SHARE_OF_ONE_GPU
              else 0 for size in sizes]
    mean_gpus = sum(size if not share else share / MILLI_PER_GPU
                    for size, share in zip(sizes, shares, strict=True)) / pod_count
    # Little's law: pods in the system = arrival rate x mean duration.
    arrival_rate = _TARGET_LOAD * total_gpus / (mean_gpus * _MEAN_DURATION_S) if mean_gpus else 1.0
    pods = []
    now = 0.0
    for index, (size, share) in enumerate(zip(sizes, shares, strict=True)):
        now += rng.expovariate(arrival_rate)
        created = int(now)
        duration = max(60, int(rng.lognormvariate(math.log(_MEAN_DURATION_S) - 0.5, 1.0)))
        spec = "V100M16|V100M32" if size and rng.random() < 0.1 else ""
        gpu_milli = share or (MILLI_PER_GPU if size else 0)
        qos = rng.choice(("LS", "BE", "Burstable")) if size else "BE"
        pods.append(TracePod(f"synth-pod-{index:05d}", rng.choice((4000, 8000, 16000)),
                             rng.choice((16384, 32768, 65536)), size, gpu_milli, spec, qos,
                             "Succeeded", created, created + duration, created))
    return nodes, pods
