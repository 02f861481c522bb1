"""In-node GPU choice and node choice: AVA's two lessons, GPU sharing, and the policies' scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_sched.allocation import GpuRequest, NodeGpus, Placement, RequestError
from gpu_sched.placement import feasible_nodes
from gpu_sched.policies import make_policy
from gpu_sched.topology import dual_socket_pcie, link_rank, parse_nvidia_smi_topo

DATA = Path(__file__).resolve().parent / "data"


def node_with(name: str, used: dict[int, int] | None = None, gpus: int = 8) -> NodeGpus:
    node = NodeGpus(name, dual_socket_pcie(gpus), "V100")
    for gpu, milli in (used or {}).items():
        node.apply(Placement((gpu,), milli))
    return node


def test_two_gpus_under_one_socket_beat_a_cross_socket_pair() -> None:
    # GPU3 sits on socket 0, GPU4 and GPU5 on socket 1: {3, 4} would cross QPI.
    node = node_with("n", {0: 1000, 1: 1000, 2: 1000, 6: 1000, 7: 1000})
    placement = node.choose(GpuRequest(gpus=2))
    assert placement is not None
    assert placement.gpus == (4, 5)
    assert placement.bottleneck == link_rank("PIX")


def test_pair_from_an_idle_pcie_server_shares_a_pcie_switch() -> None:
    placement = node_with("n").choose(GpuRequest(gpus=2))
    assert placement is not None and placement.bottleneck == link_rank("PIX")


def test_nvlink_pairs_with_more_links_win_on_a_dgx1() -> None:
    node = NodeGpus("dgx", parse_nvidia_smi_topo((DATA / "topo_dgx1_v100.txt").read_text()))
    pair = node.choose(GpuRequest(gpus=2))
    assert pair is not None and pair.bottleneck == link_rank("NV2")
    quad = node.choose(GpuRequest(gpus=4))
    assert quad is not None and quad.bottleneck == link_rank("NV1")
    assert quad.gpus in ((0, 1, 2, 3), (4, 5, 6, 7))


def test_choice_keeps_the_other_socket_whole_for_the_next_job() -> None:
    # With GPU0 taken, (2,3), (4,5) and (6,7) are equally good pairs; only (2,3) leaves a full
    # socket of four free GPUs behind.
    placement = node_with("n", {0: 1000}).choose(GpuRequest(gpus=2))
    assert placement is not None and placement.gpus == (2, 3)


def test_a_single_gpu_comes_from_the_worst_connected_spot() -> None:
    placement = node_with("n", {0: 1000, 2: 1000, 3: 1000}).choose(GpuRequest(gpus=1))
    assert placement is not None and placement.gpus == (1,)


def test_shared_requests_are_best_fit_onto_partly_used_gpus() -> None:
    node = node_with("n", {0: 600, 1: 300})
    assert node.choose(GpuRequest(milli=300)) == Placement((0,), 300)
    assert node.choose(GpuRequest(milli=500)) == Placement((1,), 500)
    fresh = node.choose(GpuRequest(milli=800))
    assert fresh is not None and fresh.gpus[0] not in (0, 1) and fresh.milli_each == 800


def test_shared_gpus_are_not_free_for_whole_gpu_requests() -> None:
    node = node_with("n", {gpu: 100 for gpu in range(7)})
    assert node.choose(GpuRequest(gpus=2)) is None
    fits, rejected = feasible_nodes(GpuRequest(gpus=2), [node])
    assert not fits
    assert rejected["n"].reason == "only 1 of 8 GPUs free, pod asks 2"


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": 1, "milli": 500}, "not both"),
    ({"milli": 1000}, "1-999"),
    ({"gpus": -1}, "negative"),
])
def test_impossible_requests_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        GpuRequest(**kwargs)


def test_model_and_size_rejections_are_unresolvable() -> None:
    small = NodeGpus("small", dual_socket_pcie(4), "T4")
    fits, rejected = feasible_nodes(GpuRequest(gpus=8, models=frozenset({"V100"})), [small])
    assert not fits
    assert rejected["small"].reason == "GPU model T4 is not one of V100"
    assert rejected["small"].unresolvable
    fits, rejected = feasible_nodes(GpuRequest(gpus=8), [small])
    assert rejected["small"].reason == "node has 4 GPUs, pod asks 8" and rejected["small"].unresolvable


def test_binpack_keeps_the_eight_gpu_machine_free_and_spread_does_not() -> None:
    """AVA's first lesson: two 8-GPU machines, 2 GPUs used on the first, a 2-GPU job arrives."""
    for policy_name, expected in (("binpack", "first"), ("spread", "second")):
        first, second = node_with("first", {0: 1000, 1: 1000}), node_with("second")
        request = GpuRequest(gpus=2)
        chosen = make_policy(policy_name).choose(request, feasible_nodes(request, [first, second])[0])
        assert chosen is not None and chosen[0].name == expected
        chosen[0].apply(chosen[1])
        eight = GpuRequest(gpus=8)
        fits, _ = feasible_nodes(eight, [first, second])
        assert [n.name for n in fits] == (["second"] if policy_name == "binpack" else [])


def test_binpack_prefers_a_busy_node_over_an_idle_one_at_equal_fit() -> None:
    busy = node_with("busy", {0: 1000, 1: 1000, 2: 1000, 3: 1000})
    idle = node_with("idle", gpus=4)
    chosen = make_policy("binpack").choose(GpuRequest(gpus=4), [busy, idle])
    assert chosen is not None and chosen[0].name == "busy"


def test_binpack_puts_a_share_on_a_partly_used_gpu_before_a_nearly_full_node() -> None:
    shared = node_with("shared", {0: 500})
    nearly_full = node_with("nearly-full", {g: 1000 for g in range(7)})
    chosen = make_policy("binpack").choose(GpuRequest(milli=400), [nearly_full, shared])
    assert chosen is not None and chosen[0].name == "shared" and chosen[1].gpus == (0,)


def test_scores_are_0_to_10_with_the_choice_on_top() -> None:
    nodes = [node_with("a", {0: 1000, 1: 1000}), node_with("b"), node_with("c", {0: 1000})]
    for name in ("binpack", "spread", "random"):
        scores = make_policy(name, seed=3).scores(GpuRequest(gpus=2), nodes)
        assert set(scores) == {"a", "b", "c"}
        assert all(0 <= s <= 10 for s in scores.values())
        assert sorted(scores.values())[-1] == 10 and sorted(scores.values())[-2] < 10
    assert max(make_policy("binpack").scores(GpuRequest(gpus=2), nodes).items(),
               key=lambda item: item[1])[0] == "a"


def test_random_policy_is_reproducible_for_a_seed() -> None:
    nodes = [node_with(f"n{i}") for i in range(20)]

    def picks(seed: int) -> list[str]:
        policy = make_policy("random", seed)
        return [policy.choose(GpuRequest(gpus=1), nodes)[0].name for _ in range(10)]

    assert picks(7) == picks(7)
    assert picks(7) != picks(8)
