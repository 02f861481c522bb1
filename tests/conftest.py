"""Fixtures shared by every part's tests: a real S3-compatible server and real avafs mounts.

The S3 side is moto's standalone HTTP server on a free loopback port, reached through the same
boto3 code that talks to AWS. Mounts are made through the `avafs` command line, exactly as a user
makes them, and torn down even when a test fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

AVAFS = [sys.executable, "-m", "avafs"]
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class S3Server:
    """A moto standalone server; `requests()` reads the server's own access log."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **TEST_CREDENTIALS},
        )
        wait_for_port(self.port)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def requests(self) -> list[str]:
        """Request lines ("GET /bucket/key?..." ) the server has logged so far."""
        self._log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [line.split('"')[1] for line in lines if line.count('"') >= 2 and "HTTP/1.1" in line]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self._log.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("moto") / "access.log")
    yield server
    server.stop()


@pytest.fixture
def s3_env(monkeypatch) -> dict[str, str]:
    """Credentials for the test server in this process and every child it starts."""
    for name, value in TEST_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return dict(TEST_CREDENTIALS)


@pytest.fixture
def bucket(s3_server, s3_env) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def is_mounted(path: Path) -> bool:
    target = str(Path(path).resolve())
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == target for line in mountinfo)


def unmount(path: Path) -> None:
    if is_mounted(path):
        subprocess.run(AVAFS + ["umount", "--no-flush", str(path)], capture_output=True,
                       timeout=120)
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


@pytest.fixture
def mount(tmp_path) -> Iterator[Callable[..., Path]]:
    """mount(*args, mountpoint=None, cache_dir=None) runs `avafs mount ARGS... MOUNTPOINT`.

    Returns the mountpoint; every mount made through it is unmounted at teardown. The cache dir
    defaults to one per test so tests never share cached blocks.
    """
    mounted: list[Path] = []

    def _mount(*args: str, mountpoint: Path | None = None, cache_dir: Path | None = None,
               check: bool = True) -> Path:
        mountpoint = mountpoint or tmp_path / f"mnt{len(mounted)}"
        mountpoint.mkdir(parents=True, exist_ok=True)
        cache_dir = cache_dir or tmp_path / "cache"
        command = AVAFS + ["mount", *args, str(mountpoint), "--cache-dir", str(cache_dir)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"avafs mount failed ({result.returncode}): {result.stderr}")
        mounted.append(mountpoint)
        return mountpoint

    yield _mount
    for path in reversed(mounted):
        unmount(path)


@pytest.fixture
def local_bucket(tmp_path) -> Path:
    """A directory used as a file:// bucket."""
    path = tmp_path / "bucket"
    path.mkdir()
    return path


def run_avafs(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(AVAFS + list(args), capture_output=True, text=True, timeout=timeout,
                          **kwargs)


@pytest.fixture(scope="session", autouse=True)
def _fuse_available() -> None:
    if not Path("/dev/fuse").exists() or shutil.which("fusermount3") is None:
        pytest.exit("avafs tests need /dev/fuse and fusermount3 (apt-get install fuse3)", 2)
