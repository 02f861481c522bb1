"""Mounts sharing one cluster tier (`--cluster-cache`) on a real SeaweedFS cluster: separate
daemons, cache dirs and mountpoints, as nodes are, over one file:// origin whose reads each
daemon counts (`bytes_served.store`, `store_requests.get`).

A node reads what another read without the origin; `avafs warmup --tier cluster` fills the
tier alone, and a fresh node then reads with no origin bytes; the status, its text and
Prometheus show the tier's counters; nodes cold-reading one dataset together read it from
the origin about once, not once each; with the cluster store hung or down, reads through a
mount come from the origin, correct, after a stall of a few `--cluster-timeout`s at most.
"""

from __future__ import annotations

import os
import signal
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
    # A timeout far above the default: on a loaded machine a fresh bucket's first writes can
    # outlast one second, and a failed claim pauses claims (the sharing this test measures);
    # the reads under a slow or hung cluster store are the next test's.
    nodes = [cluster_mount(name, "--cluster-timeout", "5") for name in ("x", "y", "z")]
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


def test_reads_go_to_the_origin_when_the_cluster_store_hangs_or_is_down(cluster_mount,
                                                                        local_bucket,
                                                                        seaweed_cluster):
    """A hung gateway (SIGSTOP: connections accepted, never answered) costs each daemon about
    one `--cluster-timeout` per pause of the tier; a stopped SeaweedFS (connections refused)
    costs nothing. Either way every byte comes from the origin, intact."""
    files = {f"{name}.bin": os.urandom(8 * MiB) for name in ("warm", "cold", "late")}
    for name, data in files.items():
        (local_bucket / name).write_bytes(data)
    node_a = cluster_mount("a", "--cluster-timeout", "0.5")
    assert (node_a / "warm.bin").read_bytes() == files["warm.bin"]
    _settled(Client(node_a))
    node_b = cluster_mount("b", "--cluster-timeout", "0.5")
    node_c = cluster_mount("c", "--cluster-timeout", "0.5")

    gateway = seaweed_cluster.s3.process
    gateway.send_signal(signal.SIGSTOP)
    try:
        for name in ("warm.bin", "cold.bin"):
            started = time.monotonic()
            assert (node_b / name).read_bytes() == files[name]
            assert time.monotonic() - started < 4.0, f"{name}: stalled on the hung store"
    finally:
        gateway.send_signal(signal.SIGCONT)
    status = Client(node_b).status()
    assert status["bytes_served"]["store"] == 2 * 8 * MiB
    assert sum(status["cluster"]["errors"].values()) >= 1

    seaweed_cluster.stop()
    started = time.monotonic()
    assert (node_c / "late.bin").read_bytes() == files["late.bin"]
    assert time.monotonic() - started < 2.0, "a store that refuses connections costs no wait"
    assert Client(node_c).status()["bytes_served"]["store"] == 8 * MiB
