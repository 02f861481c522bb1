"""The cluster tier (tiers/cluster.py) on a real SeaweedFS cluster, under TierStacks of their
own over one file:// origin: each stack stands for one node.

What is pinned down: a block one node read is served to another without the origin; a changed
object gets new blocks; a damaged or truncated block is a miss and is refilled; fills never
block a reader and are dropped (counted) past their memory bound; the filling marker makes a
second node wait for the first instead of reading the origin, and a dead node's marker stops
counting; a store that is down or loses a volume server costs no read.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from avafs.metrics import Metrics
from avafs.objects import ObjectRef
from avafs.stores.instrumented import InstrumentedStore
from avafs.stores.local import LocalStore
from avafs.stores.s3.cluster_bucket import ClusterBucket, open_cluster_bucket
from avafs.tiers.cluster import ClusterTier
from avafs.tiers.disk import DiskTier
from avafs.tiers.ram import RamTier
from avafs.tiers.stack import TierStack
from avafs.tiers.streams import CLUSTER_PIECE
from bench.servers.seaweed import SeaweedCluster

BLOCK = 256 * 1024
BLOCKS = 6
CACHE = "avafs-cache"


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory) -> Iterator[SeaweedCluster]:
    """One cluster for the module (each test uses a prefix of its own): starting one takes
    seconds on a loaded machine."""
    cluster = SeaweedCluster(tmp_path_factory.mktemp("seaweed"), volume_servers=2,
                             replication="001")
    cluster.start()
    cluster.client().create_bucket(Bucket=CACHE)
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_env(monkeypatch) -> None:
    monkeypatch.setenv("AVAFS_CLUSTER_ACCESS_KEY_ID", "seaweed")
    monkeypatch.setenv("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "seaweed-secret")


class Node:
    """A TierStack with RAM, disk and cluster tiers over the shared origin."""

    def __init__(self, root: Path, origin: Path, bucket: ClusterBucket, **tier_args) -> None:
        self.metrics = Metrics()
        self.cluster = ClusterTier(bucket, BLOCK, self.metrics, **tier_args)
        self.stack = TierStack(RamTier(64 * BLOCK, 1000, 0.9, 0.7),
                               DiskTier(root, 64 * BLOCK, 1000, 0.9, 0.7), BLOCK, 8 * BLOCK,
                               self.metrics, read_ahead=8, cluster=self.cluster)
        self.store = InstrumentedStore(LocalStore(origin), self.metrics)

    def ref(self, key: str) -> ObjectRef:
        info = self.store.head(key)
        return ObjectRef(self.store.url, self.store, key, info.etag, info.size)

    def origin_gets(self) -> int:
        return int(self.metrics.value(self.metrics.store_requests, "get"))

    def count(self, name: str, *labels: str) -> int:
        return int(self.metrics.value(getattr(self.metrics, name), *labels))

    def drain(self) -> None:
        deadline = time.monotonic() + 20
        while self.cluster.busy:
            assert time.monotonic() < deadline, "cluster fills did not finish"
            time.sleep(0.02)


@pytest.fixture
def nodes(tmp_path, seaweed, cluster_env) -> Iterator:
    origin = tmp_path / "origin"
    origin.mkdir()
    made: list[Node] = []
    prefix = tmp_path.name

    def make(endpoint: str | None = None, timeout: float = 2.0, bucket: str = CACHE,
             ready: bool = True, **tier_args) -> Node:
        """A node; `ready`: once the mount's first write is done (else straight away)."""
        node = Node(tmp_path / f"disk{len(made)}", origin,
                    open_cluster_bucket(f"s3://{bucket}/{prefix}", endpoint or seaweed.endpoint,
                                        None, timeout), **tier_args)
        made.append(node)
        if ready:
            assert node.cluster.prepared.wait(30), "the mount's first write did not end"
        return node

    make.origin = origin
    yield make
    for node in made:
        node.stack.close()


def test_a_block_read_by_one_node_is_served_to_another_and_a_changed_object_is_not(nodes):
    data = os.urandom(BLOCKS * BLOCK - 1000)
    (nodes.origin / "data").write_bytes(data)
    first, second = nodes(), nodes()
    assert first.stack.read(first.ref("data"), 0, len(data)) == data
    assert first.origin_gets() == BLOCKS
    first.drain()
    assert first.count("cluster_fills") == BLOCKS
    assert first.count("cluster_misses") == BLOCKS

    assert second.stack.read(second.ref("data"), 0, len(data)) == data
    assert second.origin_gets() == 0
    assert second.count("hits", "cluster") == BLOCKS
    assert second.metrics.value(second.metrics.bytes_served, "cluster") == len(data)

    changed = os.urandom(len(data))
    (nodes.origin / "data").write_bytes(changed)
    os.utime(nodes.origin / "data", (1, 1))
    third = nodes()
    assert third.stack.read(third.ref("data"), 0, len(data)) == changed
    assert third.origin_gets() == BLOCKS


def test_streamed_runs_go_through_the_cluster_tier(nodes):
    data = os.urandom(BLOCKS * BLOCK)
    (nodes.origin / "big").write_bytes(data)
    first, second = nodes(), nodes()
    for node in (first, second):
        ref = node.ref("big")
        assert node.stack.streams.stream(ref, 0, BLOCKS) == BLOCKS
        assert node.stack.read(ref, 0, len(data)) == data
        node.drain()
    assert first.count("cluster_fills") == BLOCKS
    assert first.origin_gets() == -(-BLOCKS // CLUSTER_PIECE), "one streaming GET a piece"
    assert second.origin_gets() == 0
    assert second.count("hits", "cluster") == BLOCKS


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_block_is_a_miss_and_is_refilled(nodes, seaweed, damage):
    data = os.urandom(BLOCK)
    (nodes.origin / "one").write_bytes(data)
    first = nodes()
    ref = first.ref("one")
    first.stack.read(ref, 0, BLOCK)
    first.drain()
    client = seaweed.client()
    key = first.cluster.bucket.prefix + first.cluster.block_key(ref.block(0))
    stored = client.get_object(Bucket=CACHE, Key=key)
    body = stored["Body"].read()
    bad = body[:100] + bytes([body[100] ^ 1]) + body[101:] if damage == "flipped" else body[:-7]
    client.put_object(Bucket=CACHE, Key=key, Body=bad, Metadata=stored["Metadata"])

    second = nodes()
    assert second.stack.read(second.ref("one"), 0, BLOCK) == data
    assert second.origin_gets() == 1
    assert second.count("cluster_errors", "corrupt") >= 1  # each look counts it
    second.drain()
    third = nodes()
    assert third.stack.read(third.ref("one"), 0, BLOCK) == data
    assert third.origin_gets() == 0


@pytest.mark.parametrize("intact", [True, False])
def test_a_block_filled_with_a_crc32_is_still_served_and_still_checked(nodes, seaweed, intact):
    """Blocks filled before the tier summed with CRC-32C carry a CRC-32 in `avafs-crc32`."""
    data = os.urandom(BLOCK)
    (nodes.origin / "one").write_bytes(data)
    first = nodes()
    ref = first.ref("one")
    key = first.cluster.bucket.prefix + first.cluster.block_key(ref.block(0))
    stored = data if intact else data[:100] + bytes([data[100] ^ 1]) + data[101:]
    seaweed.client().put_object(Bucket=CACHE, Key=key, Body=stored, Metadata={
        "avafs-size": str(BLOCK), "avafs-crc32": f"{zlib.crc32(data):08x}"})

    assert first.stack.read(ref, 0, BLOCK) == data
    assert first.origin_gets() == (0 if intact else 1)
    corrupt = first.count("cluster_errors", "corrupt")
    assert corrupt == 0 if intact else corrupt >= 1  # each look counts it


def test_fills_never_block_and_are_dropped_past_their_memory(nodes, seaweed):
    (nodes.origin / "many").write_bytes(os.urandom(10 * BLOCK))
    node = nodes(fill_memory=2 * BLOCK, timeout=20.0)
    ref = node.ref("many")
    gateway = seaweed.s3.process
    gateway.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        for index in range(10):
            node.cluster.fill(ref.block(index), os.urandom(BLOCK))
        assert time.monotonic() - started < 0.5
        assert node.count("cluster_fills_dropped") == 8
        assert node.cluster.queued_bytes == 2 * BLOCK
    finally:
        gateway.send_signal(signal.SIGCONT)
    node.drain()
    assert node.count("cluster_fills") == 2


def test_closing_writes_queued_fills_for_a_bounded_time(nodes, seaweed):
    """A store slow enough that each write takes about a second, but succeeds: closing writes
    what is queued for `close_wait`, finishes the writes under way and drops the rest."""
    from bench.servers.fault_proxy import FaultProxy

    (nodes.origin / "queued").write_bytes(os.urandom(12 * BLOCK))
    proxy = FaultProxy(int(seaweed.endpoint.rsplit(":", 1)[1]), rate=BLOCK)
    try:
        node = nodes(endpoint=proxy.endpoint, timeout=10.0, close_wait=0.5)
        proxy.mode = "slow"
        ref = node.ref("queued")
        for index in range(12):
            node.cluster.fill(ref.block(index), os.urandom(BLOCK))
        started = time.monotonic()
        node.cluster.close()
        assert time.monotonic() - started < 6, "12 writes of about 1 s on 2 threads take 6 s"
        written, dropped = node.count("cluster_fills"), node.count("cluster_fills_dropped")
        assert written + dropped == 12 and dropped >= 4
    finally:
        proxy.close()


def test_a_second_node_waits_for_the_block_the_first_claimed(nodes):
    data = os.urandom(BLOCK)
    (nodes.origin / "shared").write_bytes(data)
    first, second = nodes(), nodes()
    block = first.ref("shared").block(0)
    assert first.cluster.claim(block)
    assert not second.cluster.claim(block)

    def fill_later() -> None:
        time.sleep(0.3)
        first.cluster.fill(block, data)

    threading.Thread(target=fill_later).start()
    assert second.stack.read(second.ref("shared"), 0, BLOCK) == data
    assert second.origin_gets() == 0
    assert second.count("cluster_waits") == 1
    first.drain()
    assert first.cluster.claim(block), "the filler removed its marker"


def test_the_marker_of_a_node_that_died_stops_counting(nodes):
    data = os.urandom(BLOCK)
    (nodes.origin / "orphan").write_bytes(data)
    dead, alive = nodes(), nodes(fill_wait=1.0)
    assert dead.cluster.claim(dead.ref("orphan").block(0))
    time.sleep(2.1)  # the store's clock has whole seconds
    started = time.monotonic()
    assert alive.stack.read(alive.ref("orphan"), 0, BLOCK) == data
    assert time.monotonic() - started < 1.0
    assert alive.origin_gets() == 1
    alive.drain()
    assert alive.cluster.claim(alive.ref("orphan").block(0)), "the stale marker was removed"


def test_a_store_that_is_down_costs_no_read(nodes):
    from bench.servers.ports import free_ports

    data = os.urandom(BLOCKS * BLOCK)
    (nodes.origin / "data").write_bytes(data)
    (nodes.origin / "more").write_bytes(data)
    node = nodes(endpoint=f"http://127.0.0.1:{free_ports(1)[0]}", timeout=0.5)
    started = time.monotonic()
    assert node.stack.read(node.ref("data"), 0, len(data)) == data
    assert time.monotonic() - started < 5
    assert not node.cluster.reachable
    failures = node.count("cluster_errors", "get")
    assert 1 <= failures <= BLOCKS, "one failure per block already asking, at most"
    assert node.stack.read(node.ref("more"), 0, len(data)) == data
    assert node.count("cluster_errors", "get") == failures, "the tier is paused"
    assert node.origin_gets() == 2 * BLOCKS
    assert node.count("cluster_fills_dropped") == 2 * BLOCKS


def test_a_failed_fill_pauses_fills_not_reads(nodes, seaweed):
    from bench.servers.fault_proxy import FaultProxy

    held, fresh = os.urandom(BLOCKS * BLOCK), os.urandom(BLOCKS * BLOCK)
    (nodes.origin / "held").write_bytes(held)
    (nodes.origin / "fresh").write_bytes(fresh)
    filler = nodes()
    filler.stack.read(filler.ref("held"), 0, len(held))
    filler.drain()
    proxy = FaultProxy(int(seaweed.endpoint.rsplit(":", 1)[1]))
    try:
        node = nodes(endpoint=proxy.endpoint)
        proxy.mode = "503"
        node.cluster.fill(node.ref("fresh").block(0), fresh[:BLOCK])
        node.drain()
        proxy.mode = "pass"
        assert node.count("cluster_errors", "put") == 1
        assert node.cluster.reachable and not node.cluster.filling
        assert node.stack.read(node.ref("held"), 0, len(held)) == held
        assert node.origin_gets() == 0, "reads still go to the tier"
        assert node.stack.read(node.ref("fresh"), 0, len(fresh)) == fresh
        node.drain()
        assert node.count("cluster_fills") == 0, "fills are paused"
        assert filler.cluster.claim(filler.ref("fresh").block(1)), "and claims, so no marker"
    finally:
        proxy.close()


def test_a_marker_that_cannot_be_deleted_pauses_claims_and_is_deleted_later(nodes, seaweed):
    from bench.servers.fault_proxy import FaultProxy

    data = os.urandom(2 * BLOCK)
    (nodes.origin / "marked").write_bytes(data)
    proxy = FaultProxy(int(seaweed.endpoint.rsplit(":", 1)[1]))
    try:
        node, other = nodes(endpoint=proxy.endpoint), nodes()
        block = node.ref("marked").block(0)
        assert node.cluster.claim(block)
        proxy.mode = "503"
        node.cluster.release(block)
        node.drain()
        node.cluster.fill(node.ref("marked").block(1), data[BLOCK:])  # a fill thread's turn
        node.drain()
        assert node.count("cluster_errors", "claim") == 1, "one failed delete, no retry loop"
        assert node.cluster.reachable and not node.cluster.claiming
        assert not other.cluster.claim(block), "the marker is still there"
        proxy.mode = "pass"
        deadline = time.monotonic() + 15
        while not other.cluster.claim(block):
            assert time.monotonic() < deadline, "the left-over marker was not deleted"
            time.sleep(0.2)
    finally:
        proxy.close()


def test_one_late_claim_reads_the_source_and_two_in_a_row_pause_claims(nodes, seaweed,
                                                                         monkeypatch):
    """A store busy for a moment answers one claim too late among many: that block goes to the
    source and the node goes on claiming, since a pause would send every block it misses for
    seconds to the source unclaimed. Claims pause when the next one fails too."""
    from avafs.tiers import cluster
    from bench.servers.fault_proxy import FaultProxy

    # No fill thread's turn (each PAUSE_AFTER_ERROR seconds) may try the failed claims'
    # left-over markers while the store hangs: that delete would pause claims by itself.
    monkeypatch.setattr(cluster, "PAUSE_AFTER_ERROR", 60.0)
    (nodes.origin / "claimed").write_bytes(os.urandom(4 * BLOCK))
    proxy = FaultProxy(int(seaweed.endpoint.rsplit(":", 1)[1]))
    try:
        node = nodes(endpoint=proxy.endpoint, timeout=0.5)
        first, second, third, fourth = (node.ref("claimed").block(index) for index in range(4))
        proxy.mode = "hang"
        assert node.cluster.claim(first), "a claim that failed reads the source"
        assert "--cluster-timeout" in node.cluster.last_error, "the flag that sets its limit"
        assert node.cluster.claiming
        proxy.mode = "pass"
        assert node.cluster.claim(second)
        proxy.mode = "hang"
        assert node.cluster.claim(third)
        assert node.cluster.claiming, "the claim before it was answered"
        assert node.cluster.claim(fourth)
        assert not node.cluster.claiming, "two in a row"
        assert node.count("cluster_errors", "claim") == 3
    finally:
        proxy.close()


def test_a_fresh_bucket_loses_no_fill(nodes, seaweed):
    """A fresh bucket's first writes wait for SeaweedFS to make its volumes, which can take
    longer than the read limit: a node that reads straight after its mount still fills every
    block it read from the origin, and a late node reads none of them from there. Three fresh
    buckets in a row, as the wait comes and goes."""
    files = {f"file{number}": os.urandom(BLOCKS * BLOCK) for number in range(4)}
    for name, data in files.items():
        (nodes.origin / name).write_bytes(data)
    for attempt in range(3):
        bucket = f"fresh-{attempt}"
        seaweed.client().create_bucket(Bucket=bucket)
        first = nodes(bucket=bucket, timeout=1.0, ready=False)
        for name, data in files.items():
            assert first.stack.read(first.ref(name), 0, len(data)) == data
        first.drain()
        assert first.count("cluster_fills_dropped") == 0, f"bucket {bucket}"
        late = nodes(bucket=bucket, timeout=1.0)
        for name, data in files.items():
            assert late.stack.read(late.ref(name), 0, len(data)) == data
        assert late.origin_gets() == 0, f"bucket {bucket}"


def test_a_killed_volume_server_loses_no_block(nodes, seaweed):
    data = os.urandom(BLOCKS * BLOCK)
    (nodes.origin / "kept").write_bytes(data)
    first = nodes()
    first.stack.read(first.ref("kept"), 0, len(data))
    first.drain()
    seaweed.kill_volume(0)
    try:
        second = nodes(ready=False)  # its first write may wait for the lost replica
        assert second.stack.read(second.ref("kept"), 0, len(data)) == data
        assert second.origin_gets() == 0
    finally:
        seaweed.restart_volumes(0)


def test_a_volume_server_killed_during_reads_loses_nothing(nodes, seaweed):
    """Replication 001 keeps each block on both volume servers: a node reading the tier
    while one of them dies still gets every block intact (a request that fails on the way
    goes to the origin, and the tier pauses), and the blocks are still there afterwards."""
    blocks = 24
    data = os.urandom(blocks * BLOCK)
    (nodes.origin / "kept").write_bytes(data)
    first = nodes()
    first.stack.read(first.ref("kept"), 0, len(data))
    first.drain()
    second = nodes()
    ref = second.ref("kept")
    read = [second.stack.read(ref, index * BLOCK, BLOCK) for index in range(4)]
    seaweed.kill_volume(0)
    try:
        read += [second.stack.read(ref, index * BLOCK, BLOCK) for index in range(4, blocks)]
        assert b"".join(read) == data
        from_tier = second.count("hits", "cluster")
        assert from_tier + second.origin_gets() >= blocks
        assert from_tier >= 4
        third = nodes(ready=False)
        assert third.stack.read(third.ref("kept"), 0, len(data)) == data
        assert third.origin_gets() == 0, "both copies of every block outlived the kill"
    finally:
        seaweed.restart_volumes(0)
