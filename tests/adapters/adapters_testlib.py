"""Helpers shared by the adapter tests: sample trees, shards, manifests, child processes.

Imported by name (conftest.py puts this folder on sys.path, since pytest runs with
--import-mode=importlib); the name is unique so it cannot shadow another part's helpers.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
from support import free_port, wait_for_port

from adapters.shards import write_tfrecord

REPO = Path(__file__).resolve().parents[2]


def stop_process(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def sample_payload(index: int) -> bytes:
    """A sample's bytes say which sample it is, so tests can check content, not just names."""
    return f"sample-{index:05d}".encode() * 3


def make_files(root: Path, count: int, *, dirs: int = 4) -> list[str]:
    """`count` one-file samples spread over sub-directories; returns their keys (relative paths)."""
    keys = []
    for index in range(count):
        key = f"class{index % dirs}/img{index:05d}.bin"
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(sample_payload(index))
        keys.append(key)
    return sorted(keys)


def make_tar_shards(root: Path, sizes: list[int]) -> list[str]:
    """WebDataset tar shards, samples `sNNNNN` with `.bin` and `.cls` fields; returns sample keys."""
    root.mkdir(parents=True, exist_ok=True)
    keys = []
    index = 0
    for shard, size in enumerate(sizes):
        with tarfile.open(root / f"shard-{shard:04d}.tar", "w") as archive:
            for _ in range(size):
                key = f"s{index:05d}"
                for extension, data in (("bin", sample_payload(index)),
                                        ("cls", str(index % 10).encode())):
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
                keys.append(key)
                index += 1
    return keys


def make_tfrecord_shards(root: Path, sizes: list[int]) -> list[bytes]:
    """TFRecord shards whose records are sample payloads; returns all records."""
    root.mkdir(parents=True, exist_ok=True)
    records = []
    index = 0
    for shard, size in enumerate(sizes):
        shard_records = [sample_payload(index + offset) for offset in range(size)]
        write_tfrecord(root / f"shard-{shard:04d}.tfrecord", shard_records)
        records.extend(shard_records)
        index += size
    return records


def write_manifest(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_vector_samples(root: Path, count: int) -> Path:
    """Samples of 4 float32 features whose label a linear model can learn, with a manifest.

    Files go to `root/vectors/`, the manifest (paths relative to `root`) to `root/vectors.jsonl`.
    """
    rng = np.random.default_rng(0)
    (root / "vectors").mkdir(parents=True)
    lines = []
    for index in range(count):
        features = rng.normal(size=4).astype(np.float32)
        label = int(features[0] + features[1] > 0)
        (root / "vectors" / f"{index:05d}.bin").write_bytes(features.tobytes())
        lines.append({"path": f"vectors/{index:05d}.bin", "label": label})
    return write_manifest(root / "vectors.jsonl", lines)


class CoordinatorService:
    """`python -m adapters.sharding serve` as a child process, restartable on the same port."""

    def __init__(self, state: str, lease_ttl: float, log_path: Path) -> None:
        self.state = state
        self.lease_ttl = lease_ttl
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "adapters.sharding", "serve", "--state", self.state,
                 "--port", str(self.port), "--lease-ttl", str(self.lease_ttl)],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        wait_for_port(self.port)

    def kill(self) -> None:
        """kill -9: no shutdown path runs, as when a machine dies."""
        assert self.process is not None
        stop_process(self.process, signal.SIGKILL)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
