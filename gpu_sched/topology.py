"""GPU-to-GPU links within one node, in nvidia-smi's vocabulary, ranked so placements can compare them.

Placement quality is judged by the slowest link a job's GPUs must talk over (its bottleneck), so every
link class gets an integer rank where bigger is faster. The scale, best first:

    NV#  = 5 + number of bonded NVLinks (NV1 = 6, NV2 = 7, NV4 = 9, NV12 = 17, NV18 = 23)
    PIX  = 5   at most one PCIe bridge
    PXB  = 4   several PCIe bridges, no host bridge
    PHB  = 3   through a PCIe host bridge (the CPU)
    NODE = 2   between host bridges of one NUMA node
    SYS  = 1   across the inter-socket link (QPI/UPI); "SOC" in older nvidia-smi releases
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import combinations

SELF = "X"
_PCIE_RANKS = {"SYS": 1, "NODE": 2, "PHB": 3, "PXB": 4, "PIX": 5}
_ALIASES = {"SOC": "SYS"}
_NVLINK = re.compile(r"^NV(\d+)$")
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class TopologyError(ValueError):
    """Raised for topology text or JSON that cannot be trusted to describe a machine."""


def link_rank(name: str) -> int:
    """Rank of one link class; raises TopologyError for names nvidia-smi does not use."""
    name = _ALIASES.get(name, name)
    if name in _PCIE_RANKS:
        return _PCIE_RANKS[name]
    match = _NVLINK.match(name)
    if match and int(match.group(1)) > 0:
        return _PCIE_RANKS["PIX"] + int(match.group(1))
    raise TopologyError(f"unknown link type {name!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)")


def link_name(rank: int) -> str:
    """The link class of an integer rank; the inverse of link_rank for canonical names."""
    if rank > _PCIE_RANKS["PIX"]:
        return f"NV{rank - _PCIE_RANKS['PIX']}"
    for name, value in _PCIE_RANKS.items():
        if value == rank:
            return name
    raise TopologyError(f"no link class has rank {rank}")


class Topology:
    """The link between every pair of GPUs on one node.

    Instances are immutable and hashable so allocation results can be cached per (topology, free set):
    a cluster has few distinct machine types, and recomputing the same choice is the simulator's cost.
    """

    __slots__ = ("_hash", "links", "ranks")

    def __init__(self, links: Sequence[Sequence[str]]) -> None:
        size = len(links)
        if any(len(row) != size for row in links):
            raise TopologyError("the link matrix must be square")
        canonical: list[tuple[str, ...]] = []
        for i, row in enumerate(links):
            out = []
            for j, cell in enumerate(row):
                if i == j:
                    if cell != SELF:
                        raise TopologyError(f"GPU{i} must link to itself as {SELF!r}, got {cell!r}")
                    out.append(SELF)
                    continue
                link_rank(cell)
                out.append(_ALIASES.get(cell, cell))
            canonical.append(tuple(out))
        # nvidia-smi prints both directions; if they ever disagree, trust the slower one.
        ranks = [[0] * size for _ in range(size)]
        names = [list(row) for row in canonical]
        for i, j in combinations(range(size), 2):
            a, b = link_rank(canonical[i][j]), link_rank(canonical[j][i])
            worse = canonical[i][j] if a <= b else canonical[j][i]
            ranks[i][j] = ranks[j][i] = min(a, b)
            names[i][j] = names[j][i] = worse
        self.links: tuple[tuple[str, ...], ...] = tuple(tuple(row) for row in names)
        self.ranks: tuple[tuple[int, ...], ...] = tuple(tuple(row) for row in ranks)
        self._hash = hash(self.links)

    @property
    def gpu_count(self) -> int:
        return len(self.links)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topology) and self.links == other.links

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Topology({self.gpu_count} GPUs)"

    def to_annotation(self) -> str:
        """The JSON stored in the node annotation gpu-sched/topology."""
        return json.dumps({"gpus": self.gpu_count, "links": [list(row) for row in self.links]},
                          separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str) -> Topology:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyError(f"topology annotation is not JSON: {exc.msg}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("links"), list):
            raise TopologyError('topology annotation needs {"gpus": N, "links": [[...], ...]}')
        links = data["links"]
        if not all(isinstance(row, list) and all(isinstance(c, str) for c in row) for row in links):
            raise TopologyError("topology annotation links must be lists of strings")
        if data.get("gpus") != len(links):
            raise TopologyError(f"topology annotation says {data.get('gpus')!r} GPUs but has "
                                f"{len(links)} rows")
        return cls(links)


def single_socket_pcie(gpu_count: int) -> Topology:
    """What a node without a published topology is assumed to be: one socket, PCIe through the CPU."""
    return Topology([[SELF if i == j else "PHB" for j in range(gpu_count)]
                     for i in range(gpu_count)])


def dual_socket_pcie(gpu_count: int) -> Topology:
    """A common 2-socket PCIe server: half the GPUs per socket, neighbours paired under a PCIe switch.

    Used by the simulator for trace machines, whose real wiring the trace does not record; machines
    too small to split fall back to a single socket.
    """
    if gpu_count < 4 or gpu_count % 2:
        return single_socket_pcie(gpu_count)
    half = gpu_count // 2

    def link(i: int, j: int) -> str:
        if i == j:
            return SELF
        if i // half != j // half:
            return "SYS"
        return "PIX" if i // 2 == j // 2 else "PHB"

    return Topology([[link(i, j) for j in range(gpu_count)] for i in range(gpu_count)])


def parse_nvidia_smi_topo(text: str) -> Topology:
    """Read the GPU-to-GPU part of `nvidia-smi topo -m` output.

    The header names the device columns (GPUs, then NICs on machines that have them), followed by
    the multi-word affinity columns starting at "CPU Affinity". Each GPU row repeats its name and one cell per device column. NIC
    rows and columns, affinity cells and the legend are ignored: placement only needs GPU pairs.
    """
    lines = [_ANSI_ESCAPE.sub("", line).rstrip() for line in text.splitlines()]
    # The header's first column is GPU0; GPU0's own row has "X" right after its name.
    header_at = next((i for i, line in enumerate(lines)
                      if line.split()[:1] == ["GPU0"] and line.split()[1:2] != [SELF]), None)
    if header_at is None:
        raise TopologyError("no header row starting with GPU0 (is this `nvidia-smi topo -m` output?)")
    header = lines[header_at].split()
    columns = header[:header.index("CPU")] if "CPU" in header else header
    gpu_columns = [c for c in columns if c.startswith("GPU")]
    if gpu_columns != [f"GPU{i}" for i in range(len(gpu_columns))]:
        raise TopologyError(f"GPU columns are not GPU0..GPU{len(gpu_columns) - 1}: {gpu_columns}")
    rows: dict[str, list[str]] = {}
    for line in lines[header_at + 1:]:
        tokens = line.split()
        if not tokens or tokens[0] not in gpu_columns:
            continue
        cells = tokens[1:1 + len(columns)]
        if len(cells) < len(columns):
            raise TopologyError(f"row {tokens[0]} has {len(cells)} cells, expected {len(columns)}")
        rows[tokens[0]] = [cells[columns.index(gpu)] for gpu in gpu_columns]
    missing = [gpu for gpu in gpu_columns if gpu not in rows]
    if missing:
        raise TopologyError(f"no row for {', '.join(missing)}")
    return Topology([rows[gpu] for gpu in gpu_columns])
