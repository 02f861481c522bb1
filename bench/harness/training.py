"""The training workloads of the benchmark (issue 23, item 3), run in the same rounds as the
others and reported in the same table.

- Checkpoint save: one file written in 1-8 MiB writes then closed, as `torch.save` does.
  Local disk is timed with fsync before close; avafs until close() returns (ckpt_close) and
  until its flush says the store has it (ckpt_durable), against a direct boto3 multipart
  upload of the same bytes.
- ImageNet-shaped tree: files of about 110 KiB spread over 1,000 directories. An epoch is a
  walk (the listing) and then every file read by SMALL_THREADS readers; the first epoch on a
  fresh mount of each system, the second on the same mount, local disk warm.
- Readers: `AvaMapDataset` behind a DataLoader of 2 and 4 workers, and `adapters.tf.dataset`,
  over the warm avafs mount in the host's view (the daemon's socket reachable: batched
  reads) and in a pod's view (`epoch_reader.py` in a private mount namespace where a tmpfs
  covers the cache dir, so the adapters read the mount file by file), each beside the same
  reader on the local copy, taken one after the other so the three see the same load. The
  pod's view is taken twice: on the read-write mount the checkpoint is written to, and on a
  `--read-only` mount of the same cache dir after it, as the CSI driver stages a dataset
  volume that pods read only (a read-only mount reads files without FUSE opens).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import s3server
from bench.harness.common import Dataset, MiB, read_all
from bench.harness.mounts import AvafsMount, Mount, cpu_seconds
from bench.harness.profiling import MachineCpu
from bench.harness.report import DIRECT, LOCAL
from bench.harness.runner import FuseRound, Setup, add_metered, timed_with_cpu
from bench.harness.workloads import SMALL_THREADS, mb_per_s, repeated

IMAGENET_FILE_SIZE = 110 * 1024
IMAGENET_DIRECTORIES = 1000
SAMPLE_SIZE = 110 * 1024
TF_SAMPLE_SIZE = 16 * 1024
"""TensorFlow's samples are small, so what each file costs shows: FUSE's round trips in the pod
view, where tf.data reads file by file, the batched reads' in the host view."""
READER_WORKERS = (2, 4)
PIECE_SIZES = tuple(size * MiB for size in range(1, 9))
WORKLOAD_NAMES = ("checkpoint", "imagenet", "adapters", "tf")
REPO = Path(__file__).resolve().parents[2]
_READER_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint file: `size` bytes written in pieces of 1-8 MiB (a fixed sequence)."""

    size: int
    data: bytes
    """Random bytes that the pieces are cut from, a piece's length longer than the file's
    first pattern-length so that every piece is one slice."""

    @classmethod
    def make(cls, size: int) -> Checkpoint:
        return cls(size, os.urandom(min(size, 64 * MiB) + PIECE_SIZES[-1]))

    def pieces(self) -> list[int]:
        chooser, sizes, left = random.Random(self.size), [], self.size
        while left:
            sizes.append(min(left, chooser.choice(PIECE_SIZES)))
            left -= sizes[-1]
        return sizes

    def write(self, path: Path, durable: bool) -> float:
        """Seconds until close() returns (with an fsync before it when `durable`)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        view, period = memoryview(self.data), len(self.data) - PIECE_SIZES[-1]
        started = time.perf_counter()
        with open(path, "wb", buffering=0) as file:
            position = 0
            for piece in self.pieces():
                offset = position % period
                written = file.write(view[offset:offset + piece])
                if written != piece:
                    raise RuntimeError(f"short write to {path}: {written} of {piece} bytes")
                position += piece
            if durable:
                os.fsync(file.fileno())
        return time.perf_counter() - started

    @staticmethod
    def key(prefix: str) -> str:
        return f"{prefix}/checkpoint.pt"


@dataclass(frozen=True)
class TrainingPlan:
    """What the training workloads read and write; a workload not selected has None."""

    checkpoint: Checkpoint | None
    checkpoint_source: Path
    """The checkpoint on local disk: the direct upload's source."""
    imagenet: Dataset | None
    samples: Dataset | None
    tf_samples: Dataset | None
    epochs: int

    @classmethod
    def make(cls, workdir: Path, selected: set[str], checkpoint_size: int, tree_files: int,
             samples: int, epochs: int) -> TrainingPlan:
        def files(name: str, names: list[str], size: int) -> Dataset | None:
            return Dataset([], names, 0, size) if name in selected and names else None

        return cls(
            Checkpoint.make(checkpoint_size) if "checkpoint" in selected and checkpoint_size
            else None,
            workdir / "checkpoint-source.pt",
            files("imagenet", imagenet_names(tree_files), IMAGENET_FILE_SIZE),
            files("adapters", sample_names("samples", samples), SAMPLE_SIZE),
            files("tf", sample_names("tfsamples", samples), TF_SAMPLE_SIZE),
            epochs)

    @property
    def datasets(self) -> list[Dataset]:
        return [data for data in (self.imagenet, self.samples, self.tf_samples) if data]

    @property
    def names(self) -> list[str]:
        """Every object the reads need in the bucket."""
        return [name for data in self.datasets for name in data.small]

    def space_needed(self, copies: int) -> int:
        """Bytes on disk for `copies` copies of the data plus the checkpoint's writes."""
        data = sum(data.small_bytes for data in self.datasets)
        return copies * data + (4 * self.checkpoint.size if self.checkpoint else 0)


def imagenet_names(files: int) -> list[str]:
    """ImageNet's layout: the files spread over IMAGENET_DIRECTORIES class directories."""
    return [f"imagenet/{i % IMAGENET_DIRECTORIES:04d}/{i:07d}.JPEG" for i in range(files)]


def sample_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}/{i // 1000:03d}/{i:06d}.bin" for i in range(count)]


def epoch(root: Path, data: Dataset) -> float:
    """Files/s of a walk of the tree (the listing) then SMALL_THREADS readers reading it."""
    started = time.perf_counter()
    top = root / data.small[0].split("/", 1)[0]
    names = [os.path.relpath(os.path.join(folder, name), root)
             for folder, _, files in os.walk(top) for name in files]
    size, _ = read_all(root, names, threads=SMALL_THREADS)
    seconds = time.perf_counter() - started
    if len(names) != len(data.small) or size != data.small_bytes:
        raise RuntimeError(f"an epoch under {top} saw {len(names)} files and {size} bytes, "
                           f"expected {len(data.small)} and {data.small_bytes}")
    return len(names) / seconds


def run_training_local(setup: Setup, plan: TrainingPlan, number: int) -> None:
    """Local disk: the checkpoint with fsync, and the tree's epoch with its pages cached."""
    results = setup.results
    if plan.checkpoint is not None:
        target, checkpoint = setup.workdir / "local-checkpoint", plan.checkpoint
        add_metered(results, "ckpt_close", LOCAL, lambda: mb_per_s(
            checkpoint.size, checkpoint.write(target / Checkpoint.key(f"r{number}"),
                                              durable=True)))
        setup.set_aside(target)
    if plan.imagenet is not None:
        epoch(setup.local_root, plan.imagenet)
        add_metered(results, "imagenet_epoch2", LOCAL,
                    lambda: repeated(lambda: epoch(setup.local_root, plan.imagenet)))


def run_training_direct(setup: Setup, plan: TrainingPlan, number: int) -> None:
    """The checkpoint as a boto3 multipart upload of the same bytes (8 MiB parts, 8
    threads): how long a trainer that uploads its checkpoint itself waits."""
    if plan.checkpoint is None:
        return
    key = Checkpoint.key(f"writes/direct-r{number}")
    seconds, cpu, cores = timed_with_cpu(
        lambda: s3server.upload_large(setup.client, key, plan.checkpoint_source))
    setup.results.add("ckpt_durable", DIRECT, mb_per_s(plan.checkpoint.size, seconds), cpu,
                      cores)
    s3server.delete_keys(setup.client, [key])


class TrainingRound(FuseRound):
    """The training workloads on one file system in one round, on one fresh mount: the
    tree's first and second epoch (every system), then, on avafs only, the readers over the
    warm mount and the checkpoint save."""

    def __init__(self, setup: Setup, mount: Mount, number: int, plan: TrainingPlan) -> None:
        super().__init__(setup, mount, number)
        self.plan = plan

    def run(self) -> None:
        cache = self.setup.cache_dir(f"{self.name}-r{self.number}-training")
        root = self.mount.mountpoint
        self.mount.mount(cache)
        try:
            if self.plan.imagenet is not None:
                self._measure("imagenet_epoch1", lambda: epoch(root, self.plan.imagenet))
                self._measure("imagenet_epoch2",
                              lambda: repeated(lambda: epoch(root, self.plan.imagenet)))
            if isinstance(self.mount, AvafsMount):
                self._readers(cache)
                if self.plan.checkpoint is not None:
                    self._checkpoint()
        finally:
            self._unmount()
        if isinstance(self.mount, AvafsMount) and self._reader_plan():
            self._read_only_pod_views(self.mount, cache)
        self.setup.set_aside(cache)

    def _reader_plan(self) -> list[tuple[str, Dataset, int, str]]:
        """(framework, samples, DataLoader workers, result key with a {view} field)."""
        readers = []
        if self.plan.samples is not None:
            readers += [("torch", self.plan.samples, workers, f"map_{{view}}_w{workers}")
                        for workers in READER_WORKERS]
        if self.plan.tf_samples is not None:
            readers.append(("tf", self.plan.tf_samples, READER_WORKERS[0], "tf_{view}"))
        return readers

    def _read_only_pod_views(self, mount: AvafsMount, cache: Path) -> None:
        """The readers in a pod's view of the same cache dir mounted `--read-only`."""
        writable = mount.options
        mount.options = (*writable, "--read-only")
        mount.mount(cache)
        try:
            for framework, data, workers, key in self._reader_plan():
                top = data.small[0].split("/", 1)[0]
                label = key.format(view="pod_ro")
                with self.setup.profiler.record(f"r{self.number}-{label}", self._profiled_pid()):
                    rate, cpu, cores = self._read(framework, mount.mountpoint / top, data,
                                                  workers, cache)
                self.setup.results.add(label, self.name, rate, cpu, cores)
        finally:
            mount.options = writable
            self._unmount()

    def _readers(self, cache: Path) -> None:
        for framework, data, workers, key in self._reader_plan():
            top = data.small[0].split("/", 1)[0]
            rate, _, cores = self._read(framework, self.setup.local_root / top, data, workers)
            for view in ("host", "pod", "pod_ro"):
                self.setup.results.add(key.format(view=view), LOCAL, rate, machine=cores)
            for view in ("host", "pod"):
                label = key.format(view=view)
                with self.setup.profiler.record(f"r{self.number}-{label}", self._profiled_pid()):
                    rate, cpu, cores = self._read(framework, self.mount.mountpoint / top,
                                                  data, workers,
                                                  cache if view == "pod" else None)
                self.setup.results.add(label, self.name, rate, cpu, cores)

    def _read(self, framework: str, root: Path, data: Dataset, workers: int,
              covered: Path | None = None) -> tuple[float, float | None, float]:
        """(samples/s, daemon CPU seconds per epoch, busy cores of the whole machine) of
        `epoch_reader.py` over `root`; in a pod's view when `covered` (the cache dir to hide)
        is given."""
        command = [sys.executable, "-m", "bench.harness.epoch_reader", framework, str(root),
                   "--samples", str(len(data.small)), "--workers", str(workers), "--epochs",
                   str(self.plan.epochs)]
        if root.is_relative_to(self.mount.mountpoint):
            command += ["--view", "host" if covered is None else "pod",
                        "--daemon-pid", str(self.mount.pid)]
        if covered is not None:
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       f"mount -t tmpfs none {shlex.quote(str(covered))} && exec "
                       f"{shlex.join(command)}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                timeout=_READER_TIMEOUT, cwd=REPO,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        if result.returncode != 0:
            raise RuntimeError(f"{framework} reader over {root} failed ({result.returncode}): "
                               f"{result.stderr.strip()[-2000:]}")
        figures = json.loads(result.stdout.strip().splitlines()[-1])
        return figures["samples_per_s"], figures["cpu_seconds"], figures["machine_cores"]

    def _checkpoint(self) -> None:
        """One checkpoint: close() timed, then the flush until the store has it; the daemon's
        CPU seconds up to close() and up to durable."""
        checkpoint, prefix = self.plan.checkpoint, f"writes/{self.name}-r{self.number}-ckpt"
        key, pid = Checkpoint.key(prefix), self.mount.pid
        with self.setup.profiler.record(f"r{self.number}-checkpoint", self._profiled_pid()):
            cpu_before = cpu_seconds(pid)
            with MachineCpu() as closing:
                seconds = checkpoint.write(self.mount.mountpoint / key, durable=False)
            cpu_closed = cpu_seconds(pid)
            with MachineCpu() as flushing:
                flushed = self._flush("ckpt_durable", seconds, {key: checkpoint.size})
            cpu_durable = cpu_seconds(pid)
        results = self.setup.results
        results.add("ckpt_close", self.name, mb_per_s(checkpoint.size, seconds),
                    cpu_closed - cpu_before, closing.cores)
        durable_cores = (closing.seconds + flushing.seconds) / (closing.wall + flushing.wall)
        results.add("ckpt_durable", self.name, mb_per_s(checkpoint.size, seconds + flushed),
                    cpu_durable - cpu_before, durable_cores)
        s3server.delete_keys(self.setup.client, [key])
