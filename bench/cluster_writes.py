"""Writes acknowledged by the cluster: `close()` of a checkpoint and of many small files under
`--writeback cluster`, against `--writeback async` and a local disk with fsync, with the origin
behind a throttled link; the time until the origin has them; and the cluster store's own
direct upload throughput, measured in the same run.

    python3 -m bench.cluster_writes [--size 2048] [--files 10000] [--small-size 4096]
                                    [--rounds 3] [--rate 50] [--latency 0.02]

The origin is moto's S3 server behind the tests' fault proxy in "link" mode (all connections
together get `--rate` MB/s, every answer starts `--latency` s after its request). The cluster
store is a SeaweedFS cluster on loopback (two volume servers, replication 001) and etcd a real
one, as in tests/mount/test_cluster_writes.py. Each round runs every variant once, in turn (local
disk, direct upload, async, cluster), each avafs variant on a fresh mount and cache dir; the
summary gives medians over the rounds.

What is timed: a checkpoint of `--size` MiB written in 8 MiB writes, from `open()` to the
return of its acknowledgement (`close()` for avafs, which commits; `fsync()` + `close()` on
the local disk): its throughput, and that last call alone (the close latency). Small files:
`--files` files of `--small-size` bytes, each written and acknowledged the same way, one after
the other: files per second and the median close. Durable: from the acknowledgement until the
origin lists every file at its size (polled directly, not through the link). Direct: the same
checkpoint uploaded to the cluster store with boto3 (8 MiB parts, 8 at a time).

Under `cluster`, a file is acknowledged cluster-durable only if the cluster store and etcd took
it in time (a staging request's limit, avafs.writeback.cluster.queue.STAGE_TIMEOUT); else it is
node-durable and staged again later. So each
acknowledgement is followed by the mount's count of files that are only node-durable
(`unstaged` in its status), printed with the figures: a throughput with files unstaged is not
the cluster mode's. Before a mount is unmounted the benchmark waits for the daemon's own flush
(an upload the store answered with an error is retried whole, even where the origin already
lists the object), so the unmount does not wait for it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from avafs.client import Client
from bench.cluster_tier import Origin
from bench.harness.common import MiB, median
from bench.harness.mounts import AvafsMount, unmount_everything
from bench.harness.s3server import (
    BUCKET,
    CREDENTIALS,
    MotoServer,
    delete_keys,
    listed_sizes,
    upload_large,
)
from bench.servers.etcd_server import EtcdServer
from bench.servers.fault_proxy import FaultProxy
from bench.servers.seaweed import SeaweedCluster

STAGING = "avafs-staging"
RAM_CACHE = 256 * MiB
WRITE = 8 * MiB
VARIANTS = ("local", "direct", "async", "cluster")


class Writes:
    """What one variant's round measured."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}

    def checkpoint(self, path: Path, size: int, block: bytes, sync: bool) -> float:
        """Write the checkpoint; when it was acknowledged."""
        started = time.perf_counter()
        with open(path, "wb") as file:
            for offset in range(0, size, WRITE):
                file.write(block[:min(WRITE, size - offset)])
            file.flush()
            before_close = time.perf_counter()
            if sync:
                os.fsync(file.fileno())
        acknowledged = time.perf_counter()
        self.figures["checkpoint MiB/s"] = size / MiB / (acknowledged - started)
        self.figures["checkpoint close s"] = acknowledged - before_close
        return time.monotonic()

    def small_files(self, root: Path, count: int, data: bytes, sync: bool) -> float:
        root.mkdir(parents=True, exist_ok=True)
        closes = []
        started = time.perf_counter()
        for index in range(count):
            with open(root / f"f{index:06d}", "wb") as file:
                file.write(data)
                file.flush()
                before_close = time.perf_counter()
                if sync:
                    os.fsync(file.fileno())
            closes.append(time.perf_counter() - before_close)
        self.figures["small files/s"] = count / (time.perf_counter() - started)
        self.figures["small close ms"] = median(closes) * 1000
        return time.monotonic()

    def unstaged(self, name: str, client: Client) -> None:
        """Files the mount holds only node-durable now (under `cluster`; none otherwise)."""
        writes = client.status().get("cluster_writes")
        if writes is not None:
            self.figures[f"{name} unstaged"] = writes["unstaged"]

    def durable(self, name: str, since: float, in_origin: Callable[[], bool]) -> None:
        while not in_origin():
            time.sleep(0.5)
        self.figures[f"{name} durable s"] = time.monotonic() - since


class Bench:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root, self.args = root, args
        self.size = args.size * MiB
        self.block = os.urandom(WRITE)
        self.small = os.urandom(args.small_size)
        self.seaweed = SeaweedCluster(root / "seaweed", volume_servers=2, replication="001")
        self.seaweed.start()
        self.seaweed.client().create_bucket(Bucket=STAGING)
        self.seaweed.client().create_bucket(Bucket=BUCKET)
        # After the cluster started: its S3 gateway takes AWS_ACCESS_KEY_ID from the
        # environment for an identity of its own, and then refuses any other key.
        os.environ.update(CREDENTIALS)
        os.environ.setdefault("AVAFS_CLUSTER_ACCESS_KEY_ID", "seaweed")
        os.environ.setdefault("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "seaweed-secret")
        self.moto = MotoServer(root / "moto.log")
        self.origin = self.moto.client()
        self.origin.create_bucket(Bucket=BUCKET)
        self.proxy = FaultProxy(self.moto.port, rate=int(args.rate * 1e6), latency=args.latency)
        self.proxy.mode = "link"
        (root / "etcd").mkdir()
        self.etcd = EtcdServer(root / "etcd")
        self.etcd.start()

    def in_origin(self, prefix: str, expected: int, size: int) -> Callable[[], bool]:
        def check() -> bool:
            sizes = [value for key, value in listed_sizes(self.origin, prefix).items()
                     if not key.endswith("/")]  # the directory's marker
            return len(sizes) == expected and all(value == size for value in sizes)
        return check

    def local(self, number: int) -> Writes:
        writes = Writes()
        directory = self.root / "local-disk"
        directory.mkdir(exist_ok=True)
        writes.checkpoint(directory / "checkpoint.pt", self.size, self.block, sync=True)
        writes.small_files(directory / f"small{number}", self.args.files, self.small, sync=True)
        shutil.rmtree(directory / f"small{number}")
        return writes

    def direct(self, number: int) -> Writes:
        writes = Writes()
        started = time.perf_counter()
        upload_large(self.seaweed.client(), f"direct{number}.pt",
                     self.root / "local-disk" / "checkpoint.pt")
        writes.figures["checkpoint MiB/s"] = self.size / MiB / (time.perf_counter() - started)
        delete_keys(self.seaweed.client(), [f"direct{number}.pt"])
        return writes

    def avafs(self, mode: str, number: int) -> Writes:
        options = ["--writeback", mode]
        if mode == "cluster":
            options += ["--cluster-cache", f"s3://{STAGING}/round{number}",
                        "--cluster-endpoint-url", self.seaweed.endpoint, "--etcd",
                        self.etcd.client_url, "--node-name", f"bench-{number}"]
        mount = AvafsMount(Origin(self.proxy.endpoint), self.root / f"mnt-{mode}-{number}",
                           RAM_CACHE, max(4 * self.size, 4096 * MiB), tuple(options))
        cache_dir = self.root / f"cache-{mode}-{number}"
        mount.mount(cache_dir)
        writes = Writes()
        prefix = f"{mode}{number}/"
        client = Client(mount.mountpoint)
        try:
            acknowledged = writes.checkpoint(mount.mountpoint / f"{mode}{number}.pt", self.size,
                                             self.block, sync=False)
            writes.unstaged("checkpoint", client)
            writes.durable("checkpoint", acknowledged,
                           self.in_origin(f"{mode}{number}.pt", 1, self.size))
            acknowledged = writes.small_files(mount.mountpoint / prefix, self.args.files,
                                              self.small, sync=False)
            writes.unstaged("small", client)
            writes.durable("small", acknowledged,
                           self.in_origin(prefix, self.args.files, len(self.small)))
            client.flush()
        finally:
            mount.unmount()
            shutil.rmtree(cache_dir, ignore_errors=True)
        delete_keys(self.origin, [f"{mode}{number}.pt", *listed_sizes(self.origin, prefix)])
        return writes

    def round(self, number: int) -> dict[str, Writes]:
        results = {"local": self.local(number), "direct": self.direct(number)}
        for mode in ("async", "cluster"):
            results[mode] = self.avafs(mode, number)
        return results

    def stop(self) -> None:
        unmount_everything()
        self.proxy.close()
        self.moto.stop()
        self.etcd.stop()
        self.seaweed.stop()


def report(rounds: list[dict[str, Writes]]) -> None:
    for variant in VARIANTS:
        names = rounds[0][variant].figures
        line = ", ".join(f"{name} {median([r[variant].figures[name] for r in rounds]):.2f}"
                         for name in names)
        print(f"  {variant:8s} {line}")
    cluster = median([r["cluster"].figures["checkpoint MiB/s"] for r in rounds])
    direct = median([r["direct"].figures["checkpoint MiB/s"] for r in rounds])
    print(f"cluster checkpoint close() throughput / direct upload to the cluster store: "
          f"{cluster / direct:.2f} (target >= 0.7)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2048, help="checkpoint MiB")
    parser.add_argument("--files", type=int, default=10000, help="small files per round")
    parser.add_argument("--small-size", type=int, default=4096, help="bytes per small file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=50.0,
                        help="the origin link's MB/s, all connections together")
    parser.add_argument("--latency", type=float, default=0.02,
                        help="seconds before each answer of the origin starts")
    args = parser.parse_args()
    print(f"checkpoint {args.size} MiB, {args.files} files of {args.small_size} bytes, origin "
          f"link {args.rate:g} MB/s and {args.latency * 1000:g} ms, {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    with tempfile.TemporaryDirectory(prefix="avafs-cluster-writes-") as workdir:
        bench = Bench(Path(workdir), args)
        try:
            rounds = []
            for number in range(args.rounds):
                rounds.append(bench.round(number))
                print(f"round {number + 1}:", {variant: {name: round(value, 2) for name, value
                                                         in writes.figures.items()}
                                               for variant, writes in rounds[-1].items()},
                      flush=True)
        finally:
            bench.stop()
    print(f"medians of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f} at the end):")
    report(rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
