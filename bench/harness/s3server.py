"""The S3 side of the benchmark: the store on loopback (SeaweedFS, or moto's standalone
server), and direct boto3 traffic.

SeaweedFS is the default store: moto copies the whole object for every ranged GET and its own
CPU caps any client near a few hundred MB/s, so figures against it measure moto; it stays for
comparison with earlier runs. Both are started and stopped by the benchmark on free loopback
ports; the SeaweedFS processes are managed by `bench.servers.seaweed`, as in the tests.

The direct parallel download and upload are the baselines the cold-read, warmup and write
targets are measured against: they are what the same machine gets from the same server with
no file system in between, so a ratio near 1 means avafs adds almost nothing.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from bench.servers.ports import free_port
from bench.servers.seaweed import SeaweedCluster, send_empty_bodies_at_once, weed_binary

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUCKET = "bench"
STORES = ("seaweedfs", "moto")
DIRECT_THREADS = 8
_PART = 8 * 2**20
_CHUNK = 2**20


class MotoServer:
    """moto's S3 server in a child process on a free loopback port; stop() ends it."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **CREDENTIALS})
        self._wait_until_listening(30.0)

    def _wait_until_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited ({self.process.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"moto server not listening on port {self.port} after {timeout}s")

    def client(self):
        return make_client(self.endpoint)

    def version(self) -> str:
        from importlib.metadata import version

        return f"moto {version('moto')}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class SeaweedStore:
    """SeaweedFS on loopback: master, one volume server keeping one copy, filer and S3
    gateway, data under `root`."""

    def __init__(self, root: Path) -> None:
        self.cluster = SeaweedCluster(root, volume_servers=1, replication="000",
                                      volume_size_mb=1024)
        self.cluster.start()
        self.endpoint = self.cluster.endpoint

    def client(self):
        return make_client(self.endpoint)

    def version(self) -> str:
        result = subprocess.run([weed_binary(), "version"], capture_output=True, text=True,
                                check=False)
        return f"SeaweedFS {result.stdout.split()[2] if result.stdout else 'unknown'}"

    def stop(self) -> None:
        self.cluster.stop()


Store = MotoServer | SeaweedStore


def start_store(kind: str, workdir: Path) -> Store:
    if kind == "moto":
        return MotoServer(workdir / "moto.log")
    return SeaweedStore(workdir / "seaweedfs")


def make_client(endpoint: str):
    """A boto3 client with a pool large enough for every direct-traffic thread."""
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                          config=Config(max_pool_connections=4 * DIRECT_THREADS,
                                        retries={"mode": "standard", "max_attempts": 10}))
    send_empty_bodies_at_once(client)
    return client


def _pool_map(function, items: Iterable, threads: int) -> list:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(function, items))


def upload_files(client, root: Path, names: list[str], threads: int = 16) -> None:
    """Put local files under `root` to the bucket, under the same names (dataset setup)."""
    _pool_map(lambda name: client.upload_file(str(root / name), BUCKET, name,
                                              Config=TransferConfig(use_threads=False)),
              names, threads)


def put_empty(client, keys: list[str], threads: int = 16) -> None:
    _pool_map(lambda key: client.put_object(Bucket=BUCKET, Key=key, Body=b""), keys, threads)


def download_objects(client, names: list[str]) -> int:
    """Every object in one streamed GET each, DIRECT_THREADS at a time; returns bytes.

    The baseline for small files (one GET per file, files in parallel), and for large files
    the server's ceiling: whole-object GETs are the cheapest request this server answers,
    since moto serves a ranged GET by reading the whole object and slicing it."""
    def get(name: str) -> int:
        body = client.get_object(Bucket=BUCKET, Key=name)["Body"]
        total = 0
        while chunk := body.read(_CHUNK):
            total += len(chunk)
        return total

    return sum(_pool_map(get, names, DIRECT_THREADS))


class _Discard(io.RawIOBase):
    """A seekable sink for download_fileobj that only counts (no disk in the baseline)."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.size += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return offset


def download_transfer(client, names: list[str]) -> int:
    """Large files one after another, each with boto3's own parallel download (s3transfer:
    8 MiB ranged GETs, DIRECT_THREADS at a time), as `aws s3 cp` or `download_file` copy a
    dataset to local disk; returns bytes. This is the issue's "direct boto3, 8 threads"."""
    config = TransferConfig(max_concurrency=DIRECT_THREADS)
    total = 0
    for name in names:
        sink = _Discard()
        client.download_fileobj(BUCKET, name, sink, Config=config)
        total += sink.size
    return total


def upload_large(client, key: str, path: Path) -> None:
    """One large file as a multipart upload of 8 MiB parts, DIRECT_THREADS at a time."""
    config = TransferConfig(multipart_threshold=_PART, multipart_chunksize=_PART,
                            max_concurrency=DIRECT_THREADS)
    client.upload_file(str(path), BUCKET, key, Config=config)


def upload_small(client, keys: list[str], data: bytes) -> None:
    """One PUT per object across DIRECT_THREADS threads."""
    _pool_map(lambda key: client.put_object(Bucket=BUCKET, Key=key, Body=data), keys,
              DIRECT_THREADS)


def listed_sizes(client, prefix: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        sizes.update((entry["Key"], entry["Size"]) for entry in page.get("Contents", ()))
    return sizes


def delete_keys(client, keys: list[str]) -> None:
    """Remove what a write workload left, so the server's memory does not grow by round
    (keys that do not exist are fine: S3 deletes are idempotent)."""
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=BUCKET, Delete={
            "Objects": [{"Key": key} for key in keys[start:start + 1000]], "Quiet": True})
