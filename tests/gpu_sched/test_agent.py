"""The node agent publishes the parsed topology on the node, through the API server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_sched import agent
from gpu_sched.topology import Topology, parse_nvidia_smi_topo

DATA = Path(__file__).resolve().parent / "data"


def test_agent_patches_the_node_annotation(fake_api: Any, node_json: Callable[..., dict],
                                           run_module: Callable[..., Any]) -> None:
    fake_api.add_node(node_json("gpu-7", gpus=4))
    topo = DATA / "topo_4gpu_nvbridge_nics.txt"
    done = run_module("gpu_sched.agent", "--node", "gpu-7", "--topo-file", str(topo),
                      "--kube-api", fake_api.url)
    assert done.returncode == 0, done.stderr
    assert "published 4-GPU topology on node gpu-7" in done.stderr
    annotations = fake_api.nodes["gpu-7"]["metadata"]["annotations"]
    published = Topology.from_annotation(annotations["gpu-sched/topology"])
    assert published == parse_nvidia_smi_topo(topo.read_text())
    assert annotations["node.alpha.kubernetes.io/ttl"] == "0"


def test_dry_run_prints_the_annotation(run_module: Callable[..., Any]) -> None:
    done = run_module("gpu_sched.agent", "--node", "x", "--dry-run", "--topo-file",
                      str(DATA / "topo_dgx1_v100.txt"))
    assert done.returncode == 0
    key, value = done.stdout.strip().split("=", 1)
    assert key == "gpu-sched/topology"
    assert Topology.from_annotation(value).gpu_count == 8


def test_failures_are_one_line_and_non_zero(fake_api: Any, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "topo.txt"
    garbage.write_text("No devices were found\n")
    cases = [
        (["--topo-file", str(garbage), "--dry-run"], "cannot read the topology from"),
        (["--topo-file", str(tmp_path / "absent.txt"), "--dry-run"], "cannot read"),
        (["--topo-file", str(DATA / "topo_dgx1_v100.txt"), "--kube-api", fake_api.url],
         "annotating node ghost failed: HTTP 404"),
    ]
    for extra, message in cases:
        assert agent.main(["--node", "ghost", *extra]) == 1
        stderr = capsys.readouterr().err
        assert stderr.startswith("gpu_sched.agent: ") and message in stderr
        assert stderr.count("\n") == 1
    with pytest.raises(SystemExit) as exit_info:
        agent.main(["--node", "n", "--interval", "-3"])
    assert exit_info.value.code == 2 and "must be positive" in capsys.readouterr().err
