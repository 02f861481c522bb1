"""Mounts sharing one cluster tier (`--cluster-cache`) on a real SeaweedFS cluster: separate
daemons, cache dirs and mountpoints, as nodes are, over one file:// origin whose reads each
daemon counts (`bytes_served.store`, `store_requests.get`).

A node reads what another read without the origin; `avafs warmup --tier cluster` fills the
tier alone, and a fresh node then reads with no origin bytes; the status, its text and
Prometheus show the tier's counters; nodes cold-reading one dataset together read it from
the origin about once, not once each.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, run_avafs

from avafs.client import Client

MiB = 2**20
CACHE = "avafs-cache"


@pytest.fixture
def cluster_mount(seaweed_cluster, local_bucket, mount, tmp_path, monkeypatch):
    """cluster_mount(name, *args): a mount of the origin with the shared cluster tier, its
    own cache dir and mountpoint."""
    monkeypatch.setenv("AVAFS_CLUSTER_ACCESS_KEY_ID", "seaweed")
    monkeypatch.setenv("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "seaweed-secret")
    seaweed_cluster.client().create_bucket(Bucket=CACHE)

    def _mount(name: str, *args: str) -> Path:
        return mount(local_bucket.as_uri(), "--cluster-cache", f"s3://{CACHE}/nodes",
                     "--cluster-endpoint-url", seaweed_cluster.endpoint, "--block-size", "1MiB",
                     *args, mountpoint=tmp_path / f"mnt-{name}", cache_dir=tmp_path / name)
    return _mount


def _settled(client: Client) -> dict:
    """The status once the daemon's cluster fills are written."""
    deadline = time.monotonic() + 30
    while (status := client.status())["cluster"]["fill_queue_bytes"]:
        assert time.monotonic() < deadline, "cluster fills did not finish"
        time.sleep(0.05)
    return status


def test_a_node_reads_what_another_read_or_warmed_without_the_origin(cluster_mount,
                                                                     local_bucket):
    first_file, second_file = os.urandom(3 * MiB + 5), os.urandom(2 * MiB)
    (local_bucket / "a.bin").write_bytes(first_file)
    (local_bucket / "b.bin").write_bytes(second_file)
    node_a = cluster_mount("a")
    assert (node_a / "a.bin").read_bytes() == first_file
    status = _settled(Client(node_a))
    assert status["cluster"]["fills"] == 4 and status["cluster"]["misses"] == 4

    port = free_port()
    node_b = cluster_mount("b", "--metrics-addr", f"127.0.0.1:{port}")
    assert (node_b / "a.bin").read_bytes() == first_file
    status = Client(node_b).status()
    assert status["bytes_served"]["store"] == 0
    assert status["store_requests"].get("get", 0) == 0
    assert status["hits"]["cluster"] == 4
    assert status["bytes_served"]["cluster"] == len(first_file)

    warmed = run_avafs("warmup", "--tier", "cluster", str(node_b / "b.bin"))
    assert warmed.returncode == 0, warmed.stderr
    assert Client(node_b).status()["cluster"]["bytes_written"] == len(second_file)
    node_c = cluster_mount("c")
    assert (node_c / "b.bin").read_bytes() == second_file
    status = Client(node_c).status()
    assert status["bytes_served"]["store"] == 0 and status["hits"]["cluster"] == 2

    text = run_avafs("status", str(node_b)).stdout
    assert "cluster tier: s3://avafs-cache/nodes/" in text and "4 hits" in text
    exported = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(exported.decode())
               for sample in family.samples}
    hits = [value for (name, labels), value in samples.items()
            if name == "avafs_cache_hits_total" and ("tier", "cluster") in labels]
    assert hits == [4.0]
    assert any(name == "avafs_cluster_fill_bytes_total" and value == len(second_file)
               for (name, _), value in samples.items())


def test_nodes_reading_one_dataset_together_read_the_origin_about_once(cluster_mount,
                                                                        local_bucket):
    files = {f"d/{index:02}.bin": os.urandom(MiB if index % 4 else 6 * MiB)
             for index in range(12)}
    (local_bucket / "d").mkdir()
    for name, data in files.items():
        (local_bucket / name).write_bytes(data)
    nodes = [cluster_mount(name) for name in ("x", "y", "z")]
    problems: list[str] = []

    def read_everything(root: Path) -> None:
        for name, data in files.items():
            if (root / name).read_bytes() != data:
                problems.append(f"{root / name} differs")

    readers = [threading.Thread(target=read_everything, args=(root,)) for root in nodes]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert not problems
    dataset = sum(len(data) for data in files.values())
    origin = sum(Client(root).status()["bytes_served"]["store"] for root in nodes)
    amplification = origin / dataset
    print(f"origin amplification, 3 nodes with the cluster tier: {amplification:.2f}")
    assert amplification <= 1.5
