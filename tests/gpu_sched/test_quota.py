"""Quota files and their enforcement at filter and bind time, seen through the extender's HTTP API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_sched.quota import QuotaError, load_quota, parse_quota

QUOTA = """
groups:
  team-a: {gpus: 16}
  team-b: {gpus: 8}
"""


def test_refusal_reads_like_a_sentence() -> None:
    book = parse_quota(QUOTA)
    assert book.refusal("team-a", 4, lambda group: 14.0) == (
        'quota exceeded for group "team-a": 14 of 16 GPUs in use, pod asks 4')
    assert book.refusal("team-a", 2, lambda group: 14.0) is None
    assert book.refusal("team-b", 0.25, lambda group: 7.875) == (
        'quota exceeded for group "team-b": 7.875 of 8 GPUs in use, pod asks 0.25')


def test_unlabelled_and_unlisted_groups_share_the_default_entry() -> None:
    without_default = parse_quota(QUOTA)
    assert without_default.accounting_group(None) is None
    assert without_default.accounting_group("team-z") is None
    with_default = parse_quota(QUOTA + "  default: {gpus: 0}\n")
    assert with_default.accounting_group(None) == "default"
    assert with_default.accounting_group("team-z") == "default"
    assert with_default.accounting_group("team-a") == "team-a"
    assert with_default.refusal("team-z", 1, lambda group: 0.0) == (
        'quota exceeded for group "default": 0 of 0 GPUs in use, pod asks 1')


@pytest.mark.parametrize("text, message", [
    ("groups: [", "not valid YAML at line 1"),
    ("teams: {a: {gpus: 1}}", "expected a mapping with one key, groups"),
    ("groups: {team-a: 16}", "must be {gpus: N}"),
    ("groups: {team-a: {gpus: -1}}", "must be a number >= 0"),
    ("groups: {team-a: {gpus: lots}}", "must be a number >= 0"),
    ("groups: {team-a: {gpus: 4, cpus: 2}}", "must be {gpus: N}"),
])
def test_bad_quota_files_get_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(QuotaError, match=message) as error:
        parse_quota(text)
    assert "\n" not in str(error.value)


def test_missing_quota_file(tmp_path: Path) -> None:
    with pytest.raises(QuotaError, match="cannot read quota file"):
        load_quota(tmp_path / "absent.yaml")


def test_extender_enforces_quota_at_filter_and_bind(
        fake_api: Any, start_extender: Callable[..., Any], pod_json: Callable[..., dict],
        node_json: Callable[..., dict]) -> None:
    for name in ("n1", "n2"):
        fake_api.add_node(node_json(name, gpus=8))
    held = [("n1", "0,1"), ("n1", "2,3"), ("n1", "4,5"), ("n1", "6,7"), ("n2", "0,1"),
            ("n2", "2,3"), ("n2", "4,5")]
    for index, (node, gpus) in enumerate(held):
        fake_api.add_pod(pod_json(f"a-{index}", gpus=2, group="team-a", node=node, assigned=gpus))
    client = start_extender(quota=parse_quota(QUOTA))
    too_big = fake_api.add_pod(pod_json("a-big", gpus=4, group="team-a"))
    status, result = client.post("/filter", {"Pod": too_big, "NodeNames": ["n1", "n2"]})
    assert status == 200
    reason = 'quota exceeded for group "team-a": 14 of 16 GPUs in use, pod asks 4'
    assert result["NodeNames"] == []
    assert result["FailedAndUnresolvableNodes"] == {"n1": reason, "n2": reason}

    status, result = client.post("/bind", {"PodName": "a-big", "PodNamespace": "default",
                                           "PodUID": too_big["metadata"]["uid"], "Node": "n2"})
    assert status == 200 and result == {"Error": reason}
    assert "gpu-sched/gpus" not in fake_api.pod("default", "a-big")["metadata"].get("annotations", {})

    other_team = fake_api.add_pod(pod_json("b-1", gpus=2, group="team-b"))
    status, result = client.post("/filter", {"Pod": other_team, "NodeNames": ["n1", "n2"]})
    assert result["NodeNames"] == ["n2"] and result["FailedNodes"] == {
        "n1": "only 0 of 8 GPUs free, pod asks 2"}

    fits = fake_api.add_pod(pod_json("a-small", gpus=2, group="team-a"))
    status, result = client.post("/bind", {"PodName": "a-small", "PodNamespace": "default",
                                           "PodUID": fits["metadata"]["uid"], "Node": "n2"})
    assert result == {"Error": ""}
    status, result = client.post("/filter", {"Pod": pod_json("a-one", gpus=1, group="team-a"),
                                             "NodeNames": ["n2"]})
    assert result["FailedAndUnresolvableNodes"] == {
        "n2": 'quota exceeded for group "team-a": 16 of 16 GPUs in use, pod asks 1'}
