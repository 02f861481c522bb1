"""Samples per second through a PyTorch DataLoader: warm avafs mount vs the same files on disk.

    python3 -m bench.adapters_bench [--files 4000] [--size 16384] [--runs 5] [--workers 2]
                                    [--warm-epochs 8]

Writes `--files` one-file samples to a local directory, mounts that directory with avafs as a
file:// bucket, runs `--warm-epochs` untimed epochs to warm the caches, then times full
epochs through a DataLoader, alternating the local directory and the mount so both see the same
machine load. Prints the median samples/s of each and their ratio (target: mount >= 0.8x
local) for four ways of reading: `AvaIterableDataset` over the files with a new dataset and new
workers every epoch (DataLoader's defaults), the same dataset with persistent workers and
`set_epoch` reshuffling every epoch, `AvaMapDataset` over the same files with a shuffling
sampler and persistent workers, and `AvaIterableDataset` over tar shards of the same samples.
Workers remember where the files they read in place are; fresh workers take up what earlier
ones were told from the daemon's snapshot (`avafs/batch_reads/snapshot.py`).
Everything it creates (files, mount, cache) is removed at the end.
"""

from __future__ import annotations

import argparse
import io
import itertools
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from torch.utils.data import DataLoader

from adapters.torch import AvaIterableDataset, AvaMapDataset

REPO = Path(__file__).resolve().parents[1]

Epoch = Callable[[], float]
"""Runs one epoch, returns its samples per second."""


def write_samples(root: Path, files: int, size: int) -> None:
    for index in range(files):
        path = root / "files" / f"part{index % 16:02d}" / f"{index:07d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(index.to_bytes(8, "little") * (size // 8))
    per_shard = max(1, files // 16)
    (root / "shards").mkdir()
    for shard in range(0, files, per_shard):
        with tarfile.open(root / "shards" / f"shard-{shard // per_shard:04d}.tar", "w") as archive:
            for index in range(shard, min(shard + per_shard, files)):
                data = index.to_bytes(8, "little") * (size // 8)
                info = tarfile.TarInfo(f"{index:07d}.bin")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


def timed(loader: DataLoader) -> float:
    started = time.perf_counter()
    samples = sum(loader)
    return samples / (time.perf_counter() - started)


def iterable_epochs(path: Path, fmt: str, workers: int, batch_size: int, on_mount: bool) -> Epoch:
    """A new dataset and new workers every epoch, as a training loop over it does."""
    def epoch() -> float:
        dataset = AvaIterableDataset.from_prefix(path, format=fmt, require_mount=on_mount,
                                                 shuffle=True, seed=0)
        return timed(DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                collate_fn=len))
    return epoch


def persistent_iterable_epochs(path: Path, workers: int, batch_size: int,
                               on_mount: bool) -> Epoch:
    """One dataset and one DataLoader with persistent workers; `set_epoch` reshuffles."""
    dataset = AvaIterableDataset.from_prefix(path, require_mount=on_mount, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                        persistent_workers=workers > 0, collate_fn=len)
    numbers = itertools.count()

    def epoch() -> float:
        dataset.set_epoch(next(numbers))
        return timed(loader)
    return epoch


def map_epochs(path: Path, workers: int, batch_size: int, on_mount: bool) -> Epoch:
    """One dataset and one DataLoader with persistent workers for every epoch."""
    dataset = AvaMapDataset.from_prefix(path, require_mount=on_mount)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, collate_fn=len)
    return lambda: timed(loader)


def avafs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "avafs", *args], check=True, cwd=REPO, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--size", type=int, default=16384, help="bytes per sample")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--warm-epochs", type=int, default=8,
                        help="untimed epochs first, to fill the mount's caches and the readers' "
                             "tables of where files are")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="adapters-bench-"))
    local, mountpoint = work / "local", work / "mnt"
    local.mkdir()
    mountpoint.mkdir()
    mounted = False
    try:
        write_samples(local, args.files, args.size)
        avafs("mount", local.as_uri(), str(mountpoint), "--cache-dir", str(work / "cache"))
        mounted = True
        print(f"{args.files} samples of {args.size} bytes, {args.workers} DataLoader workers, "
              f"batch {args.batch_size}, median of {args.runs} epochs")
        print(f"{'dataset':<24} {'local samples/s':>16} {'mount samples/s':>16} {'ratio':>7}")
        cases: dict[str, Callable[[Path, bool], Epoch]] = {
            "files": lambda root, on_mount: iterable_epochs(
                root / "files", "files", args.workers, args.batch_size, on_mount),
            "files, persistent": lambda root, on_mount: persistent_iterable_epochs(
                root / "files", args.workers, args.batch_size, on_mount),
            "files, map, persistent": lambda root, on_mount: map_epochs(
                root / "files", args.workers, args.batch_size, on_mount),
            "tar": lambda root, on_mount: iterable_epochs(
                root / "shards", "tar", args.workers, args.batch_size, on_mount),
        }
        for name, make in cases.items():
            epochs = {on_mount: make(mountpoint if on_mount else local, on_mount)
                      for on_mount in (False, True)}
            for _ in range(args.warm_epochs):
                for on_mount in (False, True):
                    epochs[on_mount]()
            rates: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.runs):
                for on_mount in (False, True):
                    rates[on_mount].append(epochs[on_mount]())
            local_rate, mount_rate = (statistics.median(rates[False]),
                                      statistics.median(rates[True]))
            print(f"{name:<24} {local_rate:>16,.0f} {mount_rate:>16,.0f} "
                  f"{mount_rate / local_rate:>6.2f}x")
            del epochs  # persistent workers exit with their loaders
    finally:
        if mounted:
            avafs("umount", str(mountpoint))
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
