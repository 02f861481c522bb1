"""Datasets larger than the cache: shuffled epochs through a DataLoader, per epoch.

    python3 -m bench.dataset_cache [--disk-cache 64MiB] [--multiples 2 4]
                                   [--sizes 1MiB 110KiB] [--epochs 4] [--runs 1]
                                   [--systems avafs-lru avafs-dataset avafs-aware rclone juicefs]
                                   [--link MB/s] [--latency 0.02] [--settle 60]

For each file size and each dataset size (a multiple of the disk cache), every system reads
the dataset for `--epochs` shuffled epochs through a PyTorch DataLoader (the same sampler
order for all: `AvaShuffleSampler`, seed 0), from a cold cache of `--disk-cache` bytes, with
the page cache dropped before every epoch (`echo 3 > /proc/sys/vm/drop_caches`: run as root).
Prints, per epoch, the hit ratio, 1 - (bytes the store sent) / (dataset bytes), counted by a
TCP proxy in front of moto's S3 server (the tests' fault proxy, passing everything), so that every system is measured alike, prefetches
included; samples per second; and the size of the cache dir (as `du` counts it): its peak
during the epoch, sampled every `SAMPLE_EVERY` seconds, and at the epoch's end. With `--runs N`,
medians of N runs, the systems taking turns run after run; a run that fails is reported and
left out of the medians.

An equal cache: every system gets `--disk-cache` as its bound, but a peer may hold more than
its bound for a while (a cleaner that skips files closed in the last few seconds evicts
nothing read in an epoch of a few seconds). After each epoch the benchmark therefore waits, up
to `--settle` seconds, until every system's cached data is within the bound before the next
epoch starts, so each epoch starts from the same cache size; the peak shows what a system held
during the epoch, and a system still over its bound after `--settle` is reported. With
`--link`, the store is reached through a link of that many MB/s (all connections together)
whose answers start `--latency` seconds after their requests (the fault proxy's "link" mode):
the case of a dataset on a distant store, where a miss costs more than a hit.

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

from torch.utils.data import DataLoader

from adapters.torch import AvaMapDataset, AvaShuffleSampler
from avafs.config.sizes import parse_size
from bench.harness.common import PeakWatch, median
from bench.harness.mounts import AvafsMount, JuicefsMount, Mount, RcloneMount, unmount_everything
from bench.harness.s3server import BUCKET, CREDENTIALS, MotoServer
from bench.servers.fault_proxy import FaultProxy

MiB = 2**20
SYSTEMS = ("avafs-lru", "avafs-dataset", "avafs-aware", "rclone", "juicefs")
RAM_CACHE = 32 * MiB
"""avafs's RAM tier: small, so that across epochs the disk tier is what is measured; it holds
the batches in flight (`WORKERS` x `BATCH` samples) and a few windows of prefetched samples."""
WINDOW = 8
"""The sampler's shuffle window: cache_aware hints a window's uncached samples at once."""
WORKERS = 2
BATCH = 4
SAMPLE_EVERY = 0.2
"""Seconds between two samples of a cache dir's size during an epoch (its peak)."""
RCLONE_METADATA = "vfsMeta"
"""rclone's per-file metadata folder in its cache dir: not data, and not counted against its
`--vfs-cache-max-size`, so left out when the benchmark waits for it to keep to its bound."""


@dataclass(frozen=True)
class Epoch:
    hit: float
    """1 - (bytes the store sent) / (dataset bytes)."""
    rate: float
    """Samples per second."""
    peak: int
    """Largest size of the cache dir sampled during the epoch, in bytes."""
    end: int
    """Size of the cache dir when the epoch's last sample was read, in bytes."""
    over: int | None
    """Cached data still over the bound after `--settle` seconds (None: it settled)."""


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
    return sum(stat.st_blocks * 512 for stat in _stats(directory))


def data_held(directory: Path, leave_out: str | None) -> int:
    """Bytes of data the files under `directory` (but for the folder `leave_out` directly
    under it) hold, as a cache counts them against its bound: a file's size, or less where it
    is sparse, without `du`'s rounding to whole disk blocks."""
    return sum(min(stat.st_blocks * 512, stat.st_size) for stat in _stats(directory, leave_out))


def _stats(directory: Path, leave_out: str | None = None) -> list[os.stat_result]:
    stats = []
    for root, folders, files in os.walk(directory):
        if leave_out is not None and root == str(directory) and leave_out in folders:
            folders.remove(leave_out)
        for name in files:
            try:
                stats.append(os.lstat(os.path.join(root, name)))
            except FileNotFoundError:  # evicted while the folder was walked
                continue
    return stats


def settle(cache: Path, bound: int, timeout: float, leave_out: str | None) -> int | None:
    """Wait until the cached data (`data_held`) is within `bound`, for at most `timeout`
    seconds; the bytes still over it then, or None once within it."""
    deadline = time.monotonic() + timeout
    while (excess := data_held(cache, leave_out) - bound) > 0:
        if time.monotonic() >= deadline:
            return excess
        time.sleep(SAMPLE_EVERY)
    return None


def epochs(mountpoint: Path, cache: Path, case: Case, proxy: FaultProxy, count: int,
           on_avafs: bool, cache_aware: bool, bound: int, settle_for: float,
           leave_out: str | None) -> list[Epoch]:
    """Each epoch's figures; after each, the cache is given `settle_for` seconds to come
    within `bound`."""
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
        with PeakWatch(lambda: disk_used(cache), SAMPLE_EVERY) as watch:
            started = time.perf_counter()
            samples = sum(loader)
            elapsed = time.perf_counter() - started
            fetched = proxy.received_from_upstream - before
            end = disk_used(cache)
        # HTTP headers make a cold epoch fetch a little more than the dataset: shown as 0.
        results.append(Epoch(max(0.0, 1 - fetched / (case.files * case.size)),
                             samples / elapsed, max(watch.peak, end), end,
                             settle(cache, bound, settle_for, leave_out)))
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
        disk_cache: int, count: int, settle_for: float) -> list[Epoch]:
    mount = make_mount(system, ProxiedStore(proxy.endpoint, server.client), work / "mnt",
                       disk_cache)
    cache = work / f"cache-{system}"
    shutil.rmtree(cache, ignore_errors=True)
    if isinstance(mount, JuicefsMount):
        link, proxy.mode = proxy.mode, "pass"  # loading the dataset is not what is measured
        try:
            load_through(mount, case, work)
        finally:
            proxy.mode = link
    mount.mount(cache)
    try:
        return epochs(mount.mountpoint, cache, case, proxy, count, system.startswith("avafs"),
                      system == "avafs-aware", disk_cache, settle_for,
                      RCLONE_METADATA if system == "rclone" else None)
    finally:
        mount.unmount()
        shutil.rmtree(cache, ignore_errors=True)


def _row(label: str, runs: list[list[Epoch]], count: int) -> str:
    """A table row: per epoch, the medians over `runs` of hit ratio / samples/s / peak MiB /
    MiB at the end."""
    cells = []
    for epoch in range(count):
        hit, rate, peak, end = (median([getattr(result[epoch], field) for result in runs])
                                for field in ("hit", "rate", "peak", "end"))
        cells.append(f"{hit:.2f} / {rate:.0f} / {peak / MiB:.0f} / {end / MiB:.0f}")
    return f"{label:<15}" + "".join(f"{cell:>26}" for cell in cells)


def _unsettled(label: str, result: list[Epoch]) -> str | None:
    """A note naming the epochs after which the cache stayed over its bound, if any."""
    over = [f"epoch {number} +{epoch.over / MiB:.1f} MiB"
            for number, epoch in enumerate(result, 1) if epoch.over is not None]
    return f"{label}: over its bound after --settle: {', '.join(over)}" if over else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disk-cache", default="64MiB")
    parser.add_argument("--multiples", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", nargs="+", default=["1MiB", "110KiB"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--link", type=float, default=None, metavar="MB/s",
                        help="reach the store through a link of this rate (default: loopback)")
    parser.add_argument("--latency", type=float, default=0.02,
                        help="with --link: seconds before each answer of the store starts")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds each system gets after an epoch to come within its bound")
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
    if args.link is None:
        proxy = FaultProxy(server.port)
        origin = "the store on loopback"
    else:
        proxy = FaultProxy(server.port, rate=int(args.link * 1e6), latency=args.latency)
        proxy.mode = "link"
        origin = f"the store behind a {args.link:g} MB/s link, {args.latency * 1000:g} ms"
    try:
        server.client().create_bucket(Bucket=BUCKET)
        print(f"disk cache {args.disk_cache}, {origin}, {args.epochs} epochs, {WORKERS} "
              f"DataLoader workers, batch {BATCH}, {args.settle:g} s to settle after each "
              f"epoch, medians of {args.runs} run(s); per epoch: hit ratio / samples/s / MiB "
              "in the cache dir, peak during it / at its end")
        for case in cases:
            upload(server, case)
            print(f"\n{case.name}: {case.files} files, cache share "
                  f"{disk_cache / (case.files * case.size):.2f}")
            print(f"{'system':<15}" + "".join(f"{'epoch ' + str(e + 1):>26}"
                                              for e in range(args.epochs)))
            results: dict[str, list[list[Epoch]]] = {s: [] for s in systems}
            for number in range(1, args.runs + 1):  # interleaved: a change of load hits all
                for system in systems:
                    try:
                        results[system].append(run(system, case, server, proxy, work,
                                                   disk_cache, args.epochs, args.settle))
                    except (RuntimeError, OSError) as error:  # a hung unmount, a store too slow
                        print(f"{system:<15} failed: {error}", flush=True)
                        continue
                    if args.runs > 1:
                        print(_row(f"{system} #{number}", results[system][-1:], args.epochs),
                              flush=True)
                    if note := _unsettled(f"{system} #{number}", results[system][-1]):
                        print(note, flush=True)
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
