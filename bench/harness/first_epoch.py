"""The first epoch of a training job: a shuffled PyTorch DataLoader reading every file of a
dataset once, with every cache empty, as each system's users would run it.

The dataset is `--epoch-files` files of 110 KiB in 100 directories. Each round, every mount
is mounted afresh on an empty cache dir (what a new node or a new job sees; the kernel keeps
no page of a FUSE file across mounts) and read through a plain map-style `Dataset` that
lists the directory tree and opens each file; the avafs mounts are mounted afresh once more
for `AvaMapDataset` (host view: batched reads through the daemon). s3torchconnector's
`S3MapDataset` reads straight from the store and caches nothing, so it is the reference of
both rows. Whatever a system does before its first sample counts: the listing, the workers'
start, the first GETs.

The DataLoader runs in a process of its own (this module's `main`), as a training script
does: 4 workers, batches of 32, a new shuffle, no persistent workers. It prints one JSON
line with the samples/s, the busy cores of the whole machine while the epoch ran, and the
CPU seconds of the serving process (the mount's daemon; for s3torchconnector, which has
none, the reader's own processes).

    python3 -m bench.harness.first_epoch {plain,map,s3torch} SOURCE --samples N --size B
        [--endpoint URL] [--daemon-pid PID]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.common import Dataset
from bench.harness.mounts import AvafsMount, Mount, cpu_seconds
from bench.harness.profiling import MachineCpu
from bench.harness.report import S3TORCH
from bench.harness.runner import Setup
from bench.harness.s3server import BUCKET, CREDENTIALS

EPOCH = "epoch"
FILE_SIZE = 110 * 1024
DIRECTORIES = 100
WORKERS = 4
BATCH = 32
PREFIX = "epoch"
REPO = Path(__file__).resolve().parents[2]
_READER_TIMEOUT = 1800.0
MODULES = {"plain": "torch.utils.data", "map": "adapters.torch", "s3torch": "s3torchconnector"}
"""What each kind imports, imported before the clock starts: a training script's imports
are not its first epoch."""


def epoch_dataset(files: int) -> Dataset:
    """`files` files of FILE_SIZE spread over DIRECTORIES directories."""
    return Dataset([], [f"{PREFIX}/{i % DIRECTORIES:03d}/{i:06d}.JPEG" for i in range(files)],
                   0, FILE_SIZE)


@dataclass
class FirstEpochRound:
    """One round of first epochs: every mount through a plain Dataset, the avafs mounts
    through AvaMapDataset too, and s3torchconnector from the store."""

    setup: Setup
    data: Dataset
    number: int

    def run_mount(self, mount: Mount) -> None:
        kinds = ("plain", "map") if isinstance(mount, AvafsMount) else ("plain",)
        for kind in kinds:
            cache = self.setup.cache_dir(f"{mount.name}-r{self.number}-epoch-{kind}")
            mount.mount(cache)
            try:
                figures = self._read(kind, str(mount.mountpoint / PREFIX), mount.pid)
            finally:
                mount.unmount()
            self.setup.set_aside(cache)
            self.setup.results.add(f"epoch1_{kind}", mount.name, figures["samples_per_s"],
                                   figures["cpu_seconds"], figures["machine_cores"])

    def run_s3torch(self, endpoint: str) -> None:
        figures = self._read("s3torch", f"s3://{BUCKET}/{PREFIX}/", None, endpoint)
        for key in ("epoch1_plain", "epoch1_map"):
            self.setup.results.add(key, S3TORCH, figures["samples_per_s"],
                                   figures["cpu_seconds"], figures["machine_cores"])

    def _read(self, kind: str, source: str, daemon_pid: int | None,
              endpoint: str | None = None) -> dict[str, Any]:
        command = [sys.executable, "-m", "bench.harness.first_epoch", kind, source,
                   "--samples", str(len(self.data.small)), "--size", str(self.data.small_size)]
        if daemon_pid is not None:
            command += ["--daemon-pid", str(daemon_pid)]
        if endpoint is not None:
            command += ["--endpoint", endpoint]
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                timeout=_READER_TIMEOUT, cwd=REPO)
        if result.returncode != 0:
            raise RuntimeError(f"first epoch ({kind}) over {source} failed "
                               f"({result.returncode}): {result.stderr.strip()[-2000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


class FileDataset:
    """The plain map-style Dataset a training script writes: the files under a root, listed
    once, each sample the bytes of one file."""

    def __init__(self, root: str) -> None:
        self.paths = sorted(os.path.join(folder, name) for folder, _, names in os.walk(root)
                            for name in names)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> bytes:
        with open(self.paths[index], "rb") as file:
            return file.read()


def _sample_data(sample: dict[str, Any]) -> bytes:
    return sample["data"]


def _read_object(reader: Any) -> bytes:
    return reader.read()


def _tally(batch: list[bytes]) -> tuple[int, int]:
    """A batch as (samples, bytes): what the check needs, without the cost of tensors."""
    return len(batch), sum(map(len, batch))


def make_dataset(kind: str, source: str, endpoint: str | None) -> Any:
    if kind == "plain":
        return FileDataset(source)
    if kind == "map":
        from adapters.torch import AvaMapDataset

        return AvaMapDataset.from_prefix(source, _sample_data)
    from s3torchconnector import S3ClientConfig, S3MapDataset

    return S3MapDataset.from_prefix(source, region=CREDENTIALS["AWS_DEFAULT_REGION"],
                                    endpoint=endpoint, transform=_read_object,
                                    s3client_config=S3ClientConfig(force_path_style=True))


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (the DataLoader's workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_epoch(kind: str, source: str, endpoint: str | None) -> tuple[int, int]:
    """(samples, bytes) of one epoch, from the dataset's creation (its listing) on."""
    from torch.utils.data import DataLoader

    loader = DataLoader(make_dataset(kind, source, endpoint), batch_size=BATCH, shuffle=True,
                        num_workers=WORKERS, collate_fn=_tally)
    samples = size = 0
    for count, length in loader:
        samples, size = samples + count, size + length
    return samples, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("plain", "map", "s3torch"))
    parser.add_argument("source", help="a directory (plain, map) or s3://BUCKET/PREFIX/")
    parser.add_argument("--samples", type=int, required=True,
                        help="samples the epoch must yield (a short epoch is an error)")
    parser.add_argument("--size", type=int, required=True, help="bytes of each sample")
    parser.add_argument("--endpoint", help="the store's endpoint URL (s3torch)")
    parser.add_argument("--daemon-pid", type=int, help="the serving process to charge CPU to")
    args = parser.parse_args()
    importlib.import_module(MODULES[args.kind])
    own_before = own_cpu_seconds()
    daemon_before = cpu_seconds(args.daemon_pid) if args.daemon_pid else 0.0
    with MachineCpu() as machine:
        started = time.perf_counter()
        samples, size = run_epoch(args.kind, args.source, args.endpoint)
        seconds = time.perf_counter() - started
    if samples != args.samples or size != args.samples * args.size:
        raise SystemExit(f"the first epoch over {args.source} yielded {samples} samples and "
                         f"{size} bytes, expected {args.samples} and {args.samples * args.size}")
    served = (cpu_seconds(args.daemon_pid) - daemon_before if args.daemon_pid
              else own_cpu_seconds() - own_before)
    print(json.dumps({"samples_per_s": samples / seconds, "cpu_seconds": served,
                      "machine_cores": machine.cores}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
