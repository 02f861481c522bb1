"""Reading `nvidia-smi topo -m` output and ranking the links it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_sched.topology import (
    Topology,
    TopologyError,
    dual_socket_pcie,
    link_name,
    link_rank,
    parse_nvidia_smi_topo,
)

DATA = Path(__file__).resolve().parent / "data"


def load(name: str) -> Topology:
    return parse_nvidia_smi_topo((DATA / name).read_text())


def test_dgx1_hybrid_cube_mesh_with_nic_columns_and_escape_codes() -> None:
    topology = load("topo_dgx1_v100.txt")
    assert topology.gpu_count == 8
    assert topology.links[0][1:5] == ("NV1", "NV1", "NV2", "NV2")
    assert topology.links[0][5] == "SYS"
    assert topology.links[5][7] == "NV1"
    assert topology.ranks[0][3] == link_rank("NV2")


def test_pcie_two_socket_server() -> None:
    topology = load("topo_pcie_2socket_8gpu.txt")
    assert topology.gpu_count == 8
    assert (topology.links[0][1], topology.links[0][2], topology.links[0][4]) == ("PIX", "PHB", "SYS")
    assert topology == dual_socket_pcie(8)


def test_four_gpus_with_nic_rows_and_nic_legend() -> None:
    topology = load("topo_4gpu_nvbridge_nics.txt")
    assert topology.gpu_count == 4
    assert topology.links == (("X", "NV12", "NODE", "NODE"), ("NV12", "X", "NODE", "NODE"),
                              ("NODE", "NODE", "X", "NV12"), ("NODE", "NODE", "NV12", "X"))


def test_space_separated_copy_with_legacy_soc_name() -> None:
    text = """        GPU0    GPU1    CPU Affinity
GPU0     X      SOC     0-11
GPU1    SOC      X      12-23

Legend:
  X   = Self
"""
    topology = parse_nvidia_smi_topo(text)
    assert topology.links[0][1] == "SYS"


def test_link_ranking_best_first() -> None:
    order = ["NV12", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    ranks = [link_rank(name) for name in order]
    assert ranks == sorted(ranks, reverse=True)
    assert len(set(ranks)) == len(ranks)
    assert [link_name(rank) for rank in ranks] == order
    assert link_rank("SOC") == link_rank("SYS")


@pytest.mark.parametrize("text, message", [
    ("hello\nworld\n", "no header row starting with GPU0"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV1\t0-3\n", "no row for GPU1"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0\nGPU1\tFOO\t X \t0\n", "unknown link type 'FOO'"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \nGPU1\tPIX\t X \t0\n", "row GPU0 has 1 cells"),
])
def test_unreadable_output_is_rejected_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_nvidia_smi_topo(text)


def test_annotation_round_trip() -> None:
    topology = load("topo_dgx1_v100.txt")
    assert Topology.from_annotation(topology.to_annotation()) == topology


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ('{"gpus": 3, "links": [["X", "PIX"], ["PIX", "X"]]}', "says 3 GPUs but has 2 rows"),
    ('{"gpus": 2, "links": [["X", "PIX"], ["PIX"]]}', "square"),
    ('{"gpus": 2, "links": [["PIX", "PIX"], ["PIX", "X"]]}', "link to itself"),
    ('[1, 2]', "needs"),
])
def test_bad_annotations_are_rejected(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        Topology.from_annotation(text)


def test_asymmetric_cells_keep_the_slower_link() -> None:
    topology = Topology([["X", "NV2"], ["PIX", "X"]])
    assert topology.links[0][1] == topology.links[1][0] == "PIX"
