"""Data locality: node annotations of cached bytes mixed into /prioritize, and their publisher."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpu_sched.locality import CACHED_BYTES_ANNOTATION, CachePublisher

GB = 10**9


def cached_node(node_json: Callable[..., dict], name: str, cached: dict[str, int]) -> dict:
    node = node_json(name, gpus=8)
    node["metadata"]["annotations"][CACHED_BYTES_ANNOTATION] = json.dumps(cached)
    return node


@pytest.fixture
def data_cluster(fake_api: Any, pod_json: Callable[..., dict],
                 node_json: Callable[..., dict]) -> Any:
    """`busy` runs a 2-GPU job (binpack's favourite), `warm` caches 50 GB of s3://datasets,
    `full` caches the most but has no GPU free; a PVC `data` is bound to an avafs PV."""
    fake_api.add_node(cached_node(node_json, "busy", {"s3://datasets": 5 * GB}))
    fake_api.add_node(cached_node(node_json, "warm", {"s3://datasets": 50 * GB,
                                                      "s3://other": 900 * GB}))
    fake_api.add_node(cached_node(node_json, "full", {"s3://datasets": 90 * GB}))
    fake_api.add_pod(pod_json("running", gpus=2, node="busy", assigned="0,1"))
    fake_api.add_pod(pod_json("hog", gpus=8, node="full", assigned="0,1,2,3,4,5,6,7"))
    fake_api.claims[("default", "data")] = {
        "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "default"},
        "spec": {"volumeName": "datasets-pv"}}
    fake_api.volumes["datasets-pv"] = {
        "kind": "PersistentVolume", "metadata": {"name": "datasets-pv"},
        "spec": {"csi": {"driver": "csi.avafs.io", "volumeHandle": "datasets",
                         "volumeAttributes": {"source": "s3://datasets"}}}}
    return fake_api


def with_volume(pod: dict[str, Any], volume: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "data", **volume}]
    return pod


NAMES = ["busy", "warm", "full"]


@pytest.mark.parametrize("volume", [
    {"persistentVolumeClaim": {"claimName": "data"}},
    {"csi": {"driver": "csi.avafs.io", "volumeAttributes": {"source": "s3://datasets"}}},
    {"csi": {"driver": "csi.avafs.io",
             "volumeAttributes": {"namespace": "{imagenet: s3://datasets}"}}},
])
def test_prioritize_prefers_the_node_caching_the_pods_data(
        data_cluster: Any, pod_json: Callable[..., dict], start_extender: Callable[..., Any],
        volume: dict[str, Any]) -> None:
    pod = with_volume(pod_json("train", gpus=1), volume)
    scores = {e["Host"]: e["Score"] for e in start_extender(locality_weight=0.6).post(
        "/prioritize", {"Pod": pod, "NodeNames": NAMES})[1]}
    assert scores["warm"] > scores["busy"] and scores["full"] == 0
    light = {e["Host"]: e["Score"] for e in start_extender(locality_weight=0.2).post(
        "/prioritize", {"Pod": pod, "NodeNames": NAMES})[1]}
    assert light["busy"] > light["warm"] and light["full"] == 0


def test_without_avafs_data_or_with_weight_zero_the_gpu_score_stands(
        data_cluster: Any, pod_json: Callable[..., dict],
        start_extender: Callable[..., Any]) -> None:
    plain = pod_json("plain", gpus=1)
    other_driver = with_volume(pod_json("nfs", gpus=1), {"csi": {
        "driver": "nfs.csi.k8s.io", "volumeAttributes": {"source": "s3://datasets"}}})
    reading = with_volume(pod_json("train", gpus=1), {"persistentVolumeClaim": {"claimName":
                                                                                "data"}})
    gpu_only = start_extender(locality_weight=0.0)
    expected = gpu_only.post("/prioritize", {"Pod": plain, "NodeNames": NAMES})[1]
    assert max(expected, key=lambda e: e["Score"]) == {"Host": "busy", "Score": 10}
    client = start_extender(locality_weight=0.6)
    for pod in (plain, other_driver):
        assert client.post("/prioritize", {"Pod": pod, "NodeNames": NAMES})[1] == expected
    assert gpu_only.post("/prioritize", {"Pod": reading, "NodeNames": NAMES})[1] == expected


def test_missing_claim_scores_without_locality(data_cluster: Any, pod_json: Callable[..., dict],
                                               start_extender: Callable[..., Any]) -> None:
    pod = with_volume(pod_json("lost", gpus=1), {"persistentVolumeClaim": {"claimName": "gone"}})
    status, result = start_extender(locality_weight=0.6).post(
        "/prioritize", {"Pod": pod, "NodeNames": NAMES})
    assert status == 200 and max(result, key=lambda e: e["Score"])["Host"] == "busy"


def test_publisher_patches_at_most_once_per_interval_and_only_on_change() -> None:
    now = [0.0]
    figures = {"s3://datasets": 1000}
    patches: list[dict[str, str]] = []
    publisher = CachePublisher(lambda: dict(figures), patches.append, interval=60,
                               clock=lambda: now[0])
    assert publisher.maybe_publish()
    figures["s3://datasets"] = 5000
    now[0] = 59.0
    assert not publisher.maybe_publish()
    now[0] = 60.0
    assert publisher.maybe_publish()
    figures["s3://datasets"] = 5001
    now[0] = 200.0
    assert not publisher.maybe_publish()
    assert [json.loads(p[CACHED_BYTES_ANNOTATION]) for p in patches] == [
        {"s3://datasets": 1000}, {"s3://datasets": 5000}]


def test_csi_plugin_summary_reaches_the_node_annotation_the_extender_reads(
        tmp_path: Any, fake_api: Any, node_json: Callable[..., dict]) -> None:
    """Two volumes of one source and one of another, with files in their cache dirs."""
    from csi_driver.cache_summary import cached_bytes_by_source
    from csi_driver.state import StateDir, VolumeRecord
    from csi_driver.volume_spec import VolumeSpec
    from gpu_sched.k8s_objects import node_info
    from gpu_sched.kube import KubeClient, api_client

    state = StateDir(tmp_path / "state")
    sizes = {}
    for volume, source, blocks in (("a", "s3://key:secret@datasets", 3), ("b", "s3://datasets", 1),
                                   ("c", "s3://ckpt", 2)):
        cache = tmp_path / "cache" / volume
        (cache / "blocks").mkdir(parents=True)
        for index in range(blocks):
            (cache / "blocks" / str(index)).write_bytes(b"\x01" * 65536)
        sizes[volume] = sum(f.stat().st_blocks * 512 for f in cache.rglob("*") if f.is_file())
        state.save_volume(VolumeRecord(volume, f"/staging/{volume}",
                                       VolumeSpec(source, None, {}, True), str(cache)), None)
    summary = cached_bytes_by_source(state)
    assert summary == {"s3://datasets": max(sizes["a"], sizes["b"]), "s3://ckpt": sizes["c"]}
    assert sizes["a"] >= 3 * 65536

    fake_api.add_node(node_json("n1", gpus=8))
    kube = KubeClient(api_client(fake_api.url))
    publisher = CachePublisher(lambda: cached_bytes_by_source(state),
                               lambda annotations: kube.annotate_node("n1", annotations), 30)
    assert publisher.maybe_publish()
    assert node_info(fake_api.nodes["n1"]).cached == summary
    assert "secret" not in json.dumps(fake_api.nodes["n1"])
