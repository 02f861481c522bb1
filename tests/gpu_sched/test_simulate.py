"""The trace simulator: Alibaba 2023 CSV in, policy comparison out, reproducible for a seed."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_sched import simulate
from gpu_sched.trace import (
    NODE_COLUMNS,
    POD_COLUMNS,
    generate,
    read_nodes,
    read_pods,
    write_nodes,
    write_pods,
)

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
node-a,96000,786432,8,V100M32
node-b,96000,786432,8,V100M32
"""


def pods_csv(*rows: str) -> str:
    return ",".join(POD_COLUMNS) + "\n" + "\n".join(rows) + "\n"


def write(tmp_path: Path, nodes: str, pods: str) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "pods.csv").write_text(pods)
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("synthetic")
    assert simulate.main(["generate", "--nodes", "40", "--pods", "3000", "--seed", "11",
                          "--out", str(out)]) == 0
    return out / "nodes.csv", out / "pods.csv"


def test_ava_packing_scenario_replayed(tmp_path: Path) -> None:
    """2 GPUs busy on node-a, then a 2-GPU job, then an 8-GPU job."""
    nodes, pods = write(tmp_path, NODES_CSV, pods_csv(
        "old,8000,16384,2,1000,,LS,Running,0,,0",
        "two,8000,16384,2,1000,,LS,Running,10,,10",
        "eight,64000,327680,8,1000,,Burstable,Running,20,,20"))
    binpack = simulate.simulate(read_nodes(nodes), read_pods(pods), "binpack")
    spread = simulate.simulate(read_nodes(nodes), read_pods(pods), "spread")
    assert (binpack["placed"], binpack["whole_node_success_rate"]) == (3, 1.0)
    assert (spread["placed"], spread["whole_node_success_rate"]) == (2, 0.0)
    # Both pairs sit under one PCIe switch; the 8-GPU job necessarily spans the two sockets.
    assert binpack["bottleneck_links"] == {"PIX": 2, "SYS": 1}
    assert spread["bottleneck_links"] == {"PIX": 2}


def test_report_numbers_on_a_hand_checked_trace(tmp_path: Path) -> None:
    nodes, pods = write(tmp_path, NODES_CSV, pods_csv(
        "cpu,4000,8192,0,0,,BE,Running,0,100,0",
        "share,4000,8192,1,500,nan,BE,Running,0,100,",
        "pair,8000,16384,2,1000,,LS,Succeeded,0,100,0",
        "wrong-model,8000,16384,1,1000,T4,LS,Pending,0,100,",
        "quad,8000,16384,4,1000,V100M16|V100M32,LS,Running,50,100,50"))
    report = simulate.simulate(read_nodes(nodes), read_pods(pods), "binpack")
    assert {key: report[key] for key in ("pods", "gpu_pods", "placed", "failed",
                                         "whole_node_requests", "multi_gpu_placements")} == {
        "pods": 5, "gpu_pods": 4, "placed": 3, "failed": 1, "whole_node_requests": 0,
        "multi_gpu_placements": 2}
    assert report["bottleneck_links"] == {"PIX": 1, "PHB": 1}
    assert report["mean_bottleneck_link"] == 4.0
    # 0-50 s: 2.5 of 16 GPUs busy; 50-100 s: 6.5 of 16; then nothing.
    assert report["mean_gpu_utilization"] == pytest.approx((2.5 * 50 + 6.5 * 50) / 16 / 100)
    assert report["peak_gpu_utilization"] == pytest.approx(6.5 / 16)
    assert report["gpu_utilization"][-1] == [100, 0.0]
    # Until the quad arrives, 8 + 5 GPUs are free and all sit on nodes with 4 or more free.
    assert report["mean_free_gpu_fragmentation"] == 0.0


def test_fragmentation_counts_free_gpus_stranded_below_the_next_request(tmp_path: Path) -> None:
    nodes, pods = write(tmp_path, NODES_CSV, pods_csv(
        "a,1,1,6,1000,,LS,Running,0,,0",
        "b,1,1,6,1000,,LS,Running,0,,0",
        "big,1,1,4,1000,,LS,Running,10,,10"))
    report = simulate.simulate(read_nodes(nodes), read_pods(pods), "binpack")
    # Between the two arrivals 2 + 2 GPUs are free, none on a node that fits 4.
    assert report["mean_free_gpu_fragmentation"] == 1.0
    assert report["failed"] == 1


def test_binpack_places_more_whole_node_jobs_than_spread(synthetic: tuple[Path, Path]) -> None:
    nodes, pods = read_nodes(synthetic[0]), read_pods(synthetic[1])
    binpack = simulate.simulate(nodes, pods, "binpack")
    spread = simulate.simulate(nodes, pods, "spread")
    assert binpack["whole_node_requests"] == spread["whole_node_requests"] > 50
    assert binpack["whole_node_placed"] > spread["whole_node_placed"]
    assert binpack["mean_free_gpu_fragmentation"] < spread["mean_free_gpu_fragmentation"]
    assert binpack["placed"] >= spread["placed"]


def test_generator_and_random_policy_are_deterministic(tmp_path: Path,
                                                       synthetic: tuple[Path, Path]) -> None:
    again = tmp_path / "again"
    assert simulate.main(["generate", "--nodes", "40", "--pods", "3000", "--seed", "11",
                          "--out", str(again)]) == 0
    assert (again / "pods.csv").read_bytes() == synthetic[1].read_bytes()
    assert (again / "nodes.csv").read_bytes() == synthetic[0].read_bytes()
    assert generate(40, 3000, 12)[1] != generate(40, 3000, 11)[1]
    nodes, pods = read_nodes(synthetic[0]), read_pods(synthetic[1])
    first = simulate.simulate(nodes, pods, "random", seed=5)
    assert simulate.simulate(nodes, pods, "random", seed=5) == first
    assert simulate.simulate(nodes, pods, "random", seed=6) != first


def test_generated_csv_has_the_alibaba_columns(synthetic: tuple[Path, Path]) -> None:
    assert synthetic[0].read_text().splitlines()[0] == ",".join(NODE_COLUMNS)
    assert synthetic[1].read_text().splitlines()[0] == (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time")
    nodes, pods = read_nodes(synthetic[0]), read_pods(synthetic[1])
    assert {node.gpu for node in nodes} <= {2, 4, 8}
    assert any(0 < pod.gpu_milli < 1000 for pod in pods)
    assert any(pod.gpu_spec for pod in pods)


def test_round_trip_keeps_empty_times(tmp_path: Path) -> None:
    nodes, pods = write(tmp_path, NODES_CSV, pods_csv(
        "p,1000,2048,1,1000,,BE,Pending,5,9,"))
    loaded = read_pods(pods)
    assert loaded[0].scheduled_time is None
    write_pods(tmp_path / "copy.csv", loaded)
    assert (tmp_path / "copy.csv").read_text() == pods.read_text()
    write_nodes(tmp_path / "nodes-copy.csv", read_nodes(nodes))
    assert (tmp_path / "nodes-copy.csv").read_text() == NODES_CSV


@pytest.mark.parametrize("nodes, pods, message", [
    ("sn,gpu\nx,8\n", pods_csv(), "missing column(s) cpu_milli, memory_mib, model"),
    (NODES_CSV, pods_csv("p,1,1,two,1000,,LS,Running,0,1,0"),
     "line 2: num_gpu must be a whole number >= 0, got 'two'"),
    (NODES_CSV, pods_csv("p,1,1,1,1500,,LS,Running,0,1,0"), "gpu_milli must be at most 1000"),
    (NODES_CSV, pods_csv("p,1,1,1,100,,LS,Running,9,3,0"), "deletion_time 3 is before"),
    (NODES_CSV + "node-a,1,1,8,X\n", pods_csv(), "node names (sn) are not unique"),
])
def test_bad_csv_is_one_clear_line(tmp_path: Path, nodes: str, pods: str, message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    nodes_path, pods_path = write(tmp_path, nodes, pods)
    assert simulate.main(["--nodes", str(nodes_path), "--pods", str(pods_path)]) == 1
    stderr = capsys.readouterr().err
    assert stderr.startswith("gpu_sched.simulate: ") and message in stderr
    assert stderr.count("\n") == 1


def test_bad_arguments_exit_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        simulate.main(["--nodes", "a.csv", "--pods", "b.csv", "--policy", "fastest"])
    assert exit_info.value.code == 2 and "invalid choice: 'fastest'" in capsys.readouterr().err
    assert simulate.main(["--nodes", "/nonexistent.csv", "--pods", "b.csv"]) == 1
    assert "cannot read /nonexistent.csv" in capsys.readouterr().err
    assert simulate.main(["generate", "--nodes", "0", "--pods", "3", "--out", "/tmp/x"]) == 1


def test_cli_json_and_comparison_table(synthetic: tuple[Path, Path],
                                       run_module: Callable[..., Any]) -> None:
    single = run_module("gpu_sched.simulate", "--nodes", str(synthetic[0]), "--pods",
                        str(synthetic[1]), "--policy", "random", "--seed", "4", "--json")
    assert single.returncode == 0, single.stderr
    report = json.loads(single.stdout)
    for key in ("policy", "pods", "gpu_pods", "placed", "failed", "whole_node_requests",
                "whole_node_success_rate", "mean_free_gpu_fragmentation", "mean_bottleneck_link",
                "mean_bottleneck_link_name", "mean_gpu_utilization", "gpu_utilization"):
        assert key in report
    assert report["policy"] == "random" and report["seed"] == 4
    table = run_module("gpu_sched.simulate", "--nodes", str(synthetic[0]), "--pods",
                       str(synthetic[1]), "--policy", "all")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:2] == ["policy", "gpu"]
    assert [line.split()[0] for line in lines[1:]] == ["binpack", "spread", "random", "fgd"]


def test_plot_is_written_when_matplotlib_is_installed(synthetic: tuple[Path, Path],
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "compare.png"
    code = simulate.main(["--nodes", str(synthetic[0]), "--pods", str(synthetic[1]), "--policy",
                          "all", "--plot", str(plot)])
    if importlib.util.find_spec("matplotlib") is None:
        assert code == 2 and not plot.exists()
        assert "--plot needs matplotlib" in capsys.readouterr().err
    else:
        assert code == 0 and plot.read_bytes().startswith(b"\x89PNG")


def test_time_replay_enforces_cpu_and_memory_and_places_cpu_only_pods(tmp_path: Path) -> None:
    """One 8-GPU node with CPU for two 4-core pods and memory for three 10 GiB pods."""
    nodes, pods = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nn,8000,30720,8,V100M32\n",
                        pods_csv("a,4000,1024,1,1000,,LS,Running,0,,0",
                                 "b,4000,1024,1,1000,,LS,Running,1,,1",
                                 "c,1000,1024,1,1000,,LS,Running,2,,2",
                                 "cpu-hog,0,20000,0,0,,BE,Running,3,10,3",
                                 "d,0,10240,1,1000,,LS,Running,4,,4",
                                 "e,0,10240,1,1000,,LS,Running,11,,11"))
    report = simulate.simulate(read_nodes(nodes), read_pods(pods), "binpack")
    # c lacks CPU; the hog takes memory the GPU pod d then lacks; e comes after the hog left.
    assert (report["gpu_pods"], report["placed"], report["failed"]) == (5, 3, 2)
    assert (report["cpu_only_pods"], report["cpu_only_placed"]) == (1, 1)
