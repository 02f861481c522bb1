"""Nodes cold-reading one dataset from a distant origin, with and without the cluster tier
(`--cluster-cache` on a loopback SeaweedFS cluster).

    python3 -m bench.cluster_tier [--nodes 1 2 4] [--large 12] [--files 64] [--threads 2]
                                  [--rate 50] [--latency 0.02] [--runs 1] [--tier-only]
                                  [--profile DIR]

The origin is moto's S3 server behind the tests' fault proxy in "link" mode, standing in for
the cloud: all connections together get `--rate` MB/s, and every answer starts `--latency`
seconds after its request. The cluster tier is a SeaweedFS cluster on loopback (two volume
servers, replication 001), not throttled. Every node is its own daemon with its own cache dir
and mountpoint. For each node count, the nodes read the whole dataset at the same time, in the
same order (their first epoch), local only and then with the cluster tier; the origin bytes are
what the proxy relayed from moto (HTTP headers, listings and read-ahead included). After the
run with the tier a late node starts with an empty cache dir and reads the dataset (from the
cluster tier), then the first node is remounted on its cache dir and reads it again (from its
warm disk tier): the issue asks the late node for >= 0.8 x the warm node's speed. Between the
two, the store's own ceiling: every block the late node read, fetched with boto3 straight from
the S3 gateway (response checksums off, as the tier's clients), `--threads` and then
CEILING_THREADS GETs at a time. Each read is printed with the CPU seconds it took (the daemon's,
the store's processes' for the late node, the readers'): where the store runs on the nodes'
own cores, their sum over the cores bounds the late node's time. Each run's
cluster tier uses a prefix of its own, so it starts empty. `--tier-only` skips the local-only
runs; `--profile DIR` samples the late node's and the warm node's daemons with py-spy
(bench/harness/profiling.py), which slows them: a profiled run's timings are not results.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from botocore.config import Config

from avafs.client import Client
from bench.harness.common import MiB, make_dataset, median, read_all
from bench.harness.mounts import AvafsMount, cpu_seconds, unmount_everything
from bench.harness.profiling import Profiler
from bench.harness.s3server import BUCKET, CREDENTIALS, MotoServer
from bench.servers.fault_proxy import FaultProxy
from bench.servers.seaweed import SeaweedCluster

CACHE = "avafs-cache"
RAM_CACHE = 64 * MiB
"""Small, so that a remounted node reads from its disk tier, not from memory it kept."""
DISK_CACHE = 4096 * MiB
CEILING_THREADS = 8


@dataclass(frozen=True)
class Origin:
    """The origin as the mounts reach it: through the proxy."""

    endpoint: str


@dataclass
class Result:
    amplification: float
    epochs: list[float]
    late: float = 0.0
    late_amplification: float = 0.0
    warm: float = 0.0
    ceiling: tuple[float, float] = (0.0, 0.0)
    """MiB/s of the store's S3 gateway alone, `--threads` and CEILING_THREADS GETs at a time."""
    late_cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """CPU seconds during the late node's read: its daemon, the store's processes, the reader
    (this process)."""
    warm_cpu: tuple[float, float] = (0.0, 0.0)
    """CPU seconds during the warm node's read: its daemon, the reader."""
    errors: Counter[str] = field(default_factory=Counter)
    """Failed cluster tier requests by kind, every node's (`cluster.errors` of their status)."""
    dropped: int = 0
    """Blocks read from the origin but not written to the cluster tier, every node's."""


class Nodes:
    """The mounts of one run: node `index` mounts at `root/mnt-index` with cache dir
    `root/cache-index`, with the cluster tier under `prefix` when `cluster` is given."""

    def __init__(self, root: Path, origin: Origin, cluster: SeaweedCluster | None,
                 prefix: str) -> None:
        self.root = root
        self.origin = origin
        self.options = ["--read-only", "--ram-cache", str(RAM_CACHE)]
        if cluster is not None:
            self.options += ["--cluster-cache", f"s3://{CACHE}/{prefix}",
                             "--cluster-endpoint-url", cluster.endpoint]
        self.mounts: list[AvafsMount] = []

    def add(self) -> AvafsMount:
        index = len(self.mounts)
        mount = AvafsMount(self.origin, self.root / f"mnt-{index}", RAM_CACHE, DISK_CACHE,
                           tuple(self.options))
        mount.mount(self.cache_dir(index))
        self.mounts.append(mount)
        return mount

    def cache_dir(self, index: int) -> Path:
        return self.root / f"cache-{index}"

    def close(self) -> None:
        for mount in self.mounts:
            mount.unmount()


def run(names: list[str], dataset: int, nodes: int, threads: int, proxy: FaultProxy,
        cluster: SeaweedCluster | None, root: Path, profiler: Profiler) -> Result:
    group = Nodes(root, Origin(proxy.endpoint), cluster, root.name)
    try:
        mounts = [group.add() for _ in range(nodes)]
        times = [0.0] * nodes

        def read(index: int) -> None:
            times[index] = read_all(mounts[index].mountpoint, names, threads)[1]

        before = proxy.received_from_upstream
        readers = [threading.Thread(target=read, args=(index,)) for index in range(nodes)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        result = Result((proxy.received_from_upstream - before) / dataset, times)
        if cluster is None:
            return result
        for mount in mounts:
            tier = Client(mount.mountpoint).status()["cluster"]
            result.errors.update(tier["errors"])
            result.dropped += tier["fills_dropped"]
        before = proxy.received_from_upstream
        late = group.add()
        store = [process.pid for process in cluster.processes if process.pid is not None]
        before_cpu = cpu_now(late.pid, store)
        with profiler.record(f"{root.name}-late", late.pid):
            result.late = read_all(late.mountpoint, names, threads)[1]
        result.late_cpu = cpu_since(before_cpu, late.pid, store)
        result.late_amplification = (proxy.received_from_upstream - before) / dataset
        result.ceiling = (store_ceiling(cluster, root.name, threads),
                          store_ceiling(cluster, root.name, CEILING_THREADS))
        first = mounts[0]
        first.unmount()
        first.mount(group.cache_dir(0))
        before_cpu = cpu_now(first.pid, [])
        with profiler.record(f"{root.name}-warm", first.pid):
            result.warm = read_all(first.mountpoint, names, threads)[1]
        daemon, _, reader = cpu_since(before_cpu, first.pid, [])
        result.warm_cpu = (daemon, reader)
        return result
    finally:
        group.close()


def cpu_now(daemon: int, store: list[int]) -> tuple[float, float, float]:
    """CPU seconds so far of the daemon, of the store's processes together, and of this
    process (the readers): with the machine's cores, what bounds a read's wall time."""
    return cpu_seconds(daemon), sum(cpu_seconds(pid) for pid in store), time.process_time()


def cpu_since(before: tuple[float, float, float], daemon: int, store: list[int]
              ) -> tuple[float, float, float]:
    now = cpu_now(daemon, store)
    return now[0] - before[0], now[1] - before[1], now[2] - before[2]


def store_ceiling(cluster: SeaweedCluster, prefix: str, threads: int) -> float:
    """MiB/s of GETs of every block under `prefix`, `threads` at a time, by boto3 alone."""
    client = cluster.client(Config(response_checksum_validation="when_required",
                                   max_pool_connections=threads))
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=CACHE, Prefix=f"{prefix}/blocks/") for item in page.get("Contents", ())]

    def get(key: str) -> int:
        return len(client.get_object(Bucket=CACHE, Key=key)["Body"].read())

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    return total / MiB / (time.perf_counter() - started)


def report(nodes: int, local: list[Result], tier: list[Result], dataset: int,
           threads: int) -> None:
    def figure(results: list[Result], value) -> float:
        return median([value(result) for result in results])

    def epochs(results: list[Result]) -> str:
        return (f"{figure(results, lambda r: sum(r.epochs) / len(r.epochs)):6.1f} s mean, "
                f"{figure(results, lambda r: max(r.epochs)):6.1f} s slowest")

    late = figure(tier, lambda r: r.late)
    warm = figure(tier, lambda r: r.warm)
    print(f"{nodes} node(s): origin bytes / dataset {figure(local, lambda r: r.amplification):.2f}"
          f" local only, {figure(tier, lambda r: r.amplification):.2f} with the tier; first "
          f"epoch per node local only {epochs(local)}; with the tier {epochs(tier)}; late node "
          f"{late:.1f} s ({dataset / MiB / late:.0f} MiB/s, origin bytes / dataset "
          f"{figure(tier, lambda r: r.late_amplification):.2f}), warm disk {warm:.1f} s "
          f"({dataset / MiB / warm:.0f} MiB/s): late / warm speed {warm / late:.2f}; the store "
          f"alone {figure(tier, lambda r: r.ceiling[0]):.0f} MiB/s ({threads} GETs at a time), "
          f"{figure(tier, lambda r: r.ceiling[1]):.0f} MiB/s ({CEILING_THREADS})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--large", type=int, default=12, help="16 MiB files")
    parser.add_argument("--files", type=int, default=64, help="1 MiB files")
    parser.add_argument("--threads", type=int, default=2, help="readers per node")
    parser.add_argument("--rate", type=float, default=50.0,
                        help="the origin link's MB/s, all connections together")
    parser.add_argument("--latency", type=float, default=0.02,
                        help="seconds before each answer of the origin starts")
    parser.add_argument("--runs", type=int, default=1, help="report medians of this many")
    parser.add_argument("--tier-only", action="store_true", help="skip the local-only runs")
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy profiles of the late and warm nodes into this folder")
    args = parser.parse_args()
    profiler = Profiler(args.profile)
    spec = make_dataset(args.large, 16 * MiB, args.files, MiB)
    names = spec.large + spec.small
    dataset = spec.large_bytes + spec.small_bytes
    with tempfile.TemporaryDirectory(prefix="avafs-cluster-bench-") as workdir:
        root = Path(workdir)
        server = MotoServer(root / "moto.log")
        proxy = FaultProxy(server.port, rate=int(args.rate * 1e6), latency=args.latency)
        proxy.mode = "link"
        cluster = SeaweedCluster(root / "seaweed", volume_servers=2, replication="001")
        try:
            cluster.start()
            cluster.client().create_bucket(Bucket=CACHE)
            # After the cluster started: its S3 gateway takes AWS_ACCESS_KEY_ID from the
            # environment for an identity of its own, and then refuses any other key.
            os.environ.update(CREDENTIALS)
            os.environ.setdefault("AVAFS_CLUSTER_ACCESS_KEY_ID", "seaweed")
            os.environ.setdefault("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "seaweed-secret")
            s3 = server.client()
            s3.create_bucket(Bucket=BUCKET)
            for name in names:
                size = spec.large_size if name in spec.large else spec.small_size
                s3.put_object(Bucket=BUCKET, Key=name, Body=os.urandom(size))
            print(f"dataset {dataset / MiB:.0f} MiB ({args.large} x 16 MiB + {args.files} x "
                  f"1 MiB), origin link {args.rate:g} MB/s and {args.latency * 1000:g} ms, "
                  f"{args.threads} readers per node, medians of {args.runs} run(s)", flush=True)
            results: dict[tuple[int, bool], list[Result]] = {}
            for number in range(args.runs):
                for nodes in args.nodes:
                    for tier in ((cluster,) if args.tier_only else (None, cluster)):
                        result = run(names, dataset, nodes, args.threads, proxy, tier,
                                     root / f"r{number}-n{nodes}-{'tier' if tier else 'local'}",
                                     profiler)
                        print(f"  run {number + 1}, {nodes} node(s), "
                              f"{'cluster tier' if tier else 'local only'}: origin / dataset "
                              f"{result.amplification:.2f}, first epochs "
                              f"{', '.join(f'{s:.1f}' for s in result.epochs)} s"
                              + (f"; tier errors {result.errors.total()} "
                                 f"({dict(+result.errors)}), fills dropped "
                                 f"{result.dropped}; late {result.late:.1f} s (origin / "
                                 f"dataset {result.late_amplification:.2f}), warm "
                                 f"{result.warm:.1f} s; CPU s of the late read: daemon "
                                 f"{result.late_cpu[0]:.2f}, store {result.late_cpu[1]:.2f}, "
                                 f"reader {result.late_cpu[2]:.2f} ({os.cpu_count()} cores); "
                                 f"of the warm read: daemon {result.warm_cpu[0]:.2f}, reader "
                                 f"{result.warm_cpu[1]:.2f}; the store alone "
                                 f"{result.ceiling[0]:.0f} / {result.ceiling[1]:.0f} MiB/s"
                                 if tier else ""), flush=True)
                        results.setdefault((nodes, tier is not None), []).append(result)
            for nodes in args.nodes:
                report(nodes, results.get((nodes, False), []), results[nodes, True], dataset,
                       args.threads)
            print("\n".join(profiler.summaries.values()))
        finally:
            unmount_everything()
            cluster.stop()
            proxy.close()
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
