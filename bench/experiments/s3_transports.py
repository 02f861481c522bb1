"""Interleaved on/off rounds of avafs's S3 transports against SeaweedFS on loopback.

Each variant is a copy of the avafs package (a directory for PYTHONPATH) differing only in
which transports are on; every round mounts each variant in turn (order rotated per round, so
the machine's drift lands on every variant alike) on a fresh cache and times: a cold walk+stat
of TREE empty files (LIST pages), cold large reads (1 reader), cold small reads (8 readers),
small writes until flushed; with the daemon's CPU seconds for each. Run as root:

    python3 -m bench.experiments.s3_transports WORKDIR ROUNDS NAME=DIR [NAME=DIR ...]

docs/optimization-history.md ("S3 transports: which pay") says how the variants of the last
run were made.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.harness import s3server
from bench.harness.common import make_dataset, median, write_local
from bench.harness.mounts import AvafsMount, cpu_seconds, unmount_everything
from bench.harness.workloads import read_large, read_small, tree_names, walk_and_stat

LARGE, LARGE_SIZE, SMALL, SMALL_SIZE, TREE, WRITES = 2, 64 * 2**20, 1000, 100 * 1024, 5000, 300


def measure(row: dict[str, list[float]], pid: int, key: str, workload: Callable[[], float]
            ) -> None:
    cpu = cpu_seconds(pid)
    row.setdefault(key, []).append(workload())
    row.setdefault(key + "_cpu", []).append(cpu_seconds(pid) - cpu)


def walk(root: Path) -> float:
    started = time.perf_counter()
    assert walk_and_stat(root / "tree") == TREE
    return TREE / (time.perf_counter() - started)


def write_small(directory: Path, root: Path, payload: bytes) -> float:
    from avafs.client import Client

    started = time.perf_counter()
    directory.mkdir()
    for number in range(WRITES):
        (directory / f"{number:04d}").write_bytes(payload)
    Client(root).flush()
    return WRITES / (time.perf_counter() - started)


def one_round(server: s3server.Store, workdir: Path, number: int, variants: dict[str, str],
              dataset, payload: bytes, results: dict[str, dict[str, list[float]]]) -> None:
    names = list(variants)
    for name in names[number % len(names):] + names[:number % len(names)]:
        os.environ["PYTHONPATH"] = variants[name]
        mount = AvafsMount(server, workdir / "mnt", 1 << 30, 10 << 30)
        mount.mount(workdir / f"cache-{name}-{number}")
        root, pid, row = mount.mountpoint, mount.pid, results[name]
        try:
            measure(row, pid, "cold_list", partial(walk, root))
            measure(row, pid, "cold_large", partial(read_large, root, dataset))
            measure(row, pid, "cold_small", partial(read_small, root, dataset))
            measure(row, pid, "write_small",
                    partial(write_small, root / f"w-{name}-{number}", root, payload))
        finally:
            mount.unmount()
        print(name, number, {key: round(values[-1], 2) for key, values in row.items()},
              flush=True)


def main() -> None:
    workdir, rounds = Path(sys.argv[1]), int(sys.argv[2])
    variants = dict(arg.split("=", 1) for arg in sys.argv[3:])
    os.environ.update(s3server.CREDENTIALS)
    workdir.mkdir(parents=True, exist_ok=True)
    server = s3server.start_store("seaweedfs", workdir)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    try:
        dataset = make_dataset(LARGE, LARGE_SIZE, SMALL, SMALL_SIZE)
        local = workdir / "data"
        write_local(local, dataset)
        client = server.client()
        client.create_bucket(Bucket=s3server.BUCKET)
        s3server.upload_files(client, local, dataset.large + dataset.small)
        s3server.put_empty(client, tree_names(TREE))
        payload = os.urandom(SMALL_SIZE)
        for number in range(rounds):
            one_round(server, workdir, number, variants, dataset, payload, results)
    finally:
        unmount_everything()
        server.stop()
    summary = {name: {key: (round(median(values), 2), [round(value, 2) for value in values])
                      for key, values in row.items()}
               for name, row in results.items()}
    print(json.dumps(summary, indent=1))
    (workdir / "results.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
