"""Origin amplification of nodes cold-reading one dataset together, with and without the
cluster tier (`--cluster-cache` on a loopback SeaweedFS cluster).

    python3 bench/cluster_tier.py [--nodes 1 2 3] [--files 24] [--large 4] [--threads 2]

Every node is its own daemon with its own cache dir and mountpoint, over one file:// origin
(each daemon counts the bytes it read from it, `bytes_served.store`). For each node count the
nodes read the whole dataset at the same time, in the same order; the script prints origin
bytes per dataset byte and each node's read time. A node that then starts cold reads the
dataset again (from the cluster tier where there is one). The origin here is a local
directory, not a throttled cloud link: the figures are the amplification, and times only
compare the runs with each other.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))  # seaweed.py

from common import MiB, avafs, make_dataset, read_all, write_local  # noqa: E402
from seaweed import SeaweedCluster  # noqa: E402

from avafs.client import Client  # noqa: E402

CACHE = "avafs-cache"


def mount(origin: Path, root: Path, name: str, cluster: SeaweedCluster | None,
          prefix: str) -> Path:
    mountpoint = root / f"mnt-{name}"
    mountpoint.mkdir()
    tier = [] if cluster is None else ["--cluster-cache", f"s3://{CACHE}/{prefix}",
                                       "--cluster-endpoint-url", cluster.endpoint]
    avafs("mount", origin.as_uri(), str(mountpoint), "--cache-dir", str(root / name),
          "--read-only", *tier)
    return mountpoint


def run(origin: Path, names: list[str], nodes: int, threads: int,
        cluster: SeaweedCluster | None, root: Path) -> None:
    root.mkdir()
    prefix = f"n{nodes}"
    mounts = [mount(origin, root, f"{prefix}-{index}", cluster, prefix)
              for index in range(nodes)]
    try:
        times: list[float] = [0.0] * nodes

        def read(index: int) -> None:
            times[index] = read_all(mounts[index], names, threads)[1]

        readers = [threading.Thread(target=read, args=(index,)) for index in range(nodes)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        dataset = sum((origin / name).stat().st_size for name in names)
        read_from_origin = sum(Client(path).status()["bytes_served"]["store"] for path in mounts)
        late = mount(origin, root, f"{prefix}-late", cluster, prefix)
        mounts.append(late)
        late_time = read_all(late, names, threads)[1]
        late_origin = Client(late).status()["bytes_served"]["store"]
        label = "cluster tier" if cluster else "local only  "
        print(f"{label} {nodes} nodes: origin bytes / dataset {read_from_origin / dataset:.2f}, "
              f"first epoch per node {', '.join(f'{seconds:.2f}' for seconds in times)} s; "
              f"a later node: {late_time:.2f} s, origin bytes / dataset "
              f"{late_origin / dataset:.2f}", flush=True)
    finally:
        for path in mounts:
            avafs("umount", str(path), check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--files", type=int, default=24, help="1 MiB files")
    parser.add_argument("--large", type=int, default=4, help="16 MiB files")
    parser.add_argument("--threads", type=int, default=2, help="readers per node")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="avafs-cluster-bench-") as workdir:
        root = Path(workdir)
        origin = root / "origin"
        dataset = make_dataset(args.large, 16 * MiB, args.files, MiB)
        write_local(origin, dataset)
        names = dataset.large + dataset.small
        cluster = SeaweedCluster(root / "seaweed", volume_servers=2, replication="001")
        cluster.start()
        try:
            cluster.client().create_bucket(Bucket=CACHE)
            os.environ.setdefault("AVAFS_CLUSTER_ACCESS_KEY_ID", "seaweed")
            os.environ.setdefault("AVAFS_CLUSTER_SECRET_ACCESS_KEY", "seaweed-secret")
            for nodes in args.nodes:
                for tier in (None, cluster):
                    run(origin, names, nodes, args.threads, tier, root / f"{nodes}-{bool(tier)}")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
