"""Datasets larger than the cache: shuffled epochs through a DataLoader, per epoch.

    python3 bench/dataset_cache.py [--disk-cache 64MiB] [--multiples 2 4]
                                   [--sizes 1MiB 110KiB] [--epochs 4] [--runs 1]
                                   [--systems avafs-lru avafs-dataset avafs-aware rclone juicefs]

For each file size and each dataset size (a multiple of the disk cache), every system reads
the dataset for `--epochs` shuffled epochs through a PyTorch DataLoader (the same sampler
order for all: `AvaShuffleSampler`, seed 0), from a cold cache of `--disk-cache` bytes, with
the page cache dropped before every epoch (`echo 3 > /proc/sys/vm/drop_caches`: run as root).
Prints, per epoch, the hit ratio, 1 - (bytes the store sent) / (dataset bytes), counted by a
TCP proxy in front of moto's S3 server (the tests' fault proxy, passing everything), so that every system is measured alike, prefetches
included; and samples per second. With `--runs N`, medians of N runs, the systems taking
turns run after run; a run that fails is reported and left out of the medians.

Systems: avafs with `--cache-policy lru` (before issue 27), with `--cache-policy dataset`,
and with `dataset` plus the adapters' `cache_aware=True`; rclone mount (`--vfs-cache-mode
full --vfs-cache-max-size`); JuiceFS (`--cache-size`, its own format in the bucket, the
dataset written through it first). A system whose binary is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))  # the counting proxy

from common import median  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from mounts import AvafsMount, JuicefsMount, Mount, RcloneMount, unmount_everything  # noqa: E402
from s3server import BUCKET, CREDENTIALS, MotoServer  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from adapters.torch import AvaMapDataset, AvaShuffleSampler  # noqa: E402
from avafs.config.sizes import parse_size  # noqa: E402

MiB = 2**20
SYSTEMS = ("avafs-lru", "avafs-dataset", "avafs-aware", "rclone", "juicefs")
RAM_CACHE = 32 * MiB
"""avafs's RAM tier: small, so that across epochs the disk tier is what is measured; it holds
the batches in flight (`WORKERS` x `BATCH` samples) and a few windows of prefetched samples."""
WINDOW = 8
"""The sampler's shuffle window: cache_aware hints a window's uncached samples at once."""
WORKERS = 2
BATCH = 4


@dataclass(frozen=True)
class ProxiedStore:
    """The store as the mounts reach it, through the counting proxy (`endpoint`), and as the
    benchmark administers it, directly (`client`)."""

    endpoint: str
    client: Callable[[], object]


@dataclass(frozen=True)
class Case:
    size: int
    multiple: int
    files: int

    @property
    def name(self) -> str:
        return f"{self.multiple}x-{self.size // 1024}KiB"


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def upload(server: MotoServer, case: Case) -> None:
    s3 = server.client()
    for index in range(case.files):
        s3.put_object(Bucket=BUCKET, Key=f"{case.name}/{index:06d}.bin",
                      Body=os.urandom(case.size))


def load_through(mount: JuicefsMount, case: Case, work: Path) -> None:
    """Write the case's files through a JuiceFS mount (it keeps data in its own format), from
    random files made locally first."""
    source = work / "juicefs-source"
    names = [f"{case.name}/{index:06d}.bin" for index in range(case.files)]
    for name in names:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(os.urandom(case.size))
    try:
        mount.load(source, names, work / "juicefs-load-cache")
    finally:
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(work / "juicefs-load-cache", ignore_errors=True)


def disk_used(directory: Path) -> int:
    """Bytes the files under `directory` occupy, as `du` counts them."""
    return sum(path.lstat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


def epochs(mountpoint: Path, cache: Path, case: Case, proxy: FaultProxy, count: int,
           on_avafs: bool, cache_aware: bool) -> list[tuple[float, float, int]]:
    """(hit ratio, samples/s, bytes in the cache dir at its end) of each epoch."""
    dataset = AvaMapDataset.from_prefix(mountpoint / case.name, require_mount=on_avafs)
    assert len(dataset) == case.files, (len(dataset), case.files)
    sampler = AvaShuffleSampler(dataset, seed=0, shuffle_window=WINDOW, cache_aware=cache_aware)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS,
                        collate_fn=len)
    results = []
    for epoch in range(count):
        sampler.set_epoch(epoch)
        drop_caches()
        before = proxy.received_from_upstream
        started = time.perf_counter()
        samples = sum(loader)
        elapsed = time.perf_counter() - started
        fetched = proxy.received_from_upstream - before
        # HTTP headers make a cold epoch fetch a little more than the dataset: shown as 0.
        results.append((max(0.0, 1 - fetched / (case.files * case.size)), samples / elapsed,
                        disk_used(cache)))
    return results


def make_mount(system: str, store: ProxiedStore, mountpoint: Path, disk_cache: int) -> Mount:
    if system.startswith("avafs"):
        policy = "lru" if system == "avafs-lru" else "dataset"
        return AvafsMount(store, mountpoint, RAM_CACHE, disk_cache,
                          ("--read-only", "--cache-policy", policy))
    if system == "rclone":
        return RcloneMount(store, mountpoint, ("--vfs-cache-max-size", f"{disk_cache // MiB}M",
                                               "--vfs-cache-poll-interval", "1s", "--read-only"))
    return JuicefsMount(store, mountpoint, disk_cache)


def run(system: str, case: Case, server: MotoServer, proxy: FaultProxy, work: Path,
        disk_cache: int, count: int) -> list[tuple[float, float, int]]:
    mount = make_mount(system, ProxiedStore(proxy.endpoint, server.client), work / "mnt",
                       disk_cache)
    cache = work / f"cache-{system}"
    shutil.rmtree(cache, ignore_errors=True)
    if isinstance(mount, JuicefsMount):
        load_through(mount, case, work)
    mount.mount(cache)
    try:
        return epochs(mount.mountpoint, cache, case, proxy, count, system.startswith("avafs"),
                      system == "avafs-aware")
    finally:
        mount.unmount()
        shutil.rmtree(cache, ignore_errors=True)


def _row(label: str, runs: list[list[tuple[float, float, int]]], count: int) -> str:
    """A table row: per epoch, the medians over `runs` of hit ratio / samples/s / MiB."""
    cells = []
    for epoch in range(count):
        hit, rate, used = (median([result[epoch][field] for result in runs])
                           for field in range(3))
        cells.append(f"{hit:.2f} / {rate:.0f} / {used / MiB:.0f}")
    return f"{label:<15}" + "".join(f"{cell:>24}" for cell in cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disk-cache", default="64MiB")
    parser.add_argument("--multiples", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", nargs="+", default=["1MiB", "110KiB"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    args = parser.parse_args()
    disk_cache = parse_size(args.disk_cache)
    os.environ.update(CREDENTIALS)
    systems = [system for system in args.systems
               if system.startswith("avafs") or shutil.which(system)]
    for missing in set(args.systems) - set(systems):
        print(f"{missing}: not installed, skipped")
    cases = [Case(parse_size(size), multiple, multiple * disk_cache // parse_size(size))
             for size in args.sizes for multiple in args.multiples]
    work = Path(tempfile.mkdtemp(prefix="dataset-cache-bench-"))
    server = MotoServer(work / "moto.log")
    proxy = FaultProxy(server.port)
    try:
        server.client().create_bucket(Bucket=BUCKET)
        print(f"disk cache {args.disk_cache}, {args.epochs} epochs, {WORKERS} DataLoader "
              f"workers, batch {BATCH}, medians of {args.runs} run(s); per epoch: hit ratio / "
              "samples/s / MiB in the cache dir at its end")
        for case in cases:
            upload(server, case)
            print(f"\n{case.name}: {case.files} files, cache share "
                  f"{disk_cache / (case.files * case.size):.2f}")
            print(f"{'system':<15}" + "".join(f"{'epoch ' + str(e + 1):>24}"
                                              for e in range(args.epochs)))
            results: dict[str, list[list[tuple[float, float, int]]]] = {s: [] for s in systems}
            for number in range(1, args.runs + 1):  # interleaved: a change of load hits all
                for system in systems:
                    try:
                        results[system].append(run(system, case, server, proxy, work,
                                                   disk_cache, args.epochs))
                    except (RuntimeError, OSError) as error:  # a hung unmount, a store too slow
                        print(f"{system:<15} failed: {error}", flush=True)
                        continue
                    if args.runs > 1:
                        print(_row(f"{system} #{number}", results[system][-1:], args.epochs),
                              flush=True)
            if args.runs > 1:
                print("medians:")
            for system, runs in results.items():
                if runs:
                    print(_row(system, runs, args.epochs), flush=True)
    finally:
        unmount_everything()
        proxy.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
