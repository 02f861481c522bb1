"""Fixtures for the adapter tests: a real etcd and real coordinator services.

Every process started here is stopped at teardown, even when a test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from adapters_testlib import (  # noqa: E402 - needs the path above
    REPO,
    CoordinatorService,
    stop_process,
)
from support import free_port, wait_for_port  # noqa: E402


@dataclass
class Etcd:
    host: str
    port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"


@pytest.fixture(scope="session")
def etcd(tmp_path_factory) -> Iterator[Etcd]:
    """A real single-member etcd (Debian's etcd-server) on free loopback ports."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd is not installed: apt-get install -y etcd-server")
    data_dir = tmp_path_factory.mktemp("etcd")
    client_port, peer_port = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    log = open(data_dir / "etcd.log", "wb")  # noqa: SIM115 - lives as long as etcd
    process = subprocess.Popen(
        [binary, "--name", "adapters-test", "--data-dir", str(data_dir / "data"),
         "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
         "--initial-cluster", f"adapters-test={peer_url}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(client_port)
        yield Etcd("127.0.0.1", client_port, process)
    finally:
        stop_process(process)
        log.close()


@pytest.fixture
def coordinator_service(tmp_path) -> Iterator[Callable[..., CoordinatorService]]:
    """coordinator_service(state, lease_ttl=...) starts a coordinator; all are stopped after."""
    services: list[CoordinatorService] = []

    def start(state: str, lease_ttl: float = 30.0) -> CoordinatorService:
        service = CoordinatorService(state, lease_ttl, tmp_path / f"coordinator{len(services)}.log")
        services.append(service)
        service.start()
        return service

    yield start
    for service in services:
        service.stop()


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for child Python processes that import the adapters from this checkout."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.fixture
def mounted_bucket(s3_server, bucket, mount, tmp_path) -> Callable[[Path], Path]:
    """mounted_bucket(tree) uploads a local tree to a fresh S3 bucket and mounts the bucket.

    Returns the mountpoint; the files are then read only through avafs from the moto server.
    """

    def upload_and_mount(tree: Path, *mount_args: str) -> Path:
        s3 = s3_server.client()
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                s3.put_object(Bucket=bucket, Key=path.relative_to(tree).as_posix(),
                              Body=path.read_bytes())
        return mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, *mount_args,
                     mountpoint=tmp_path / "mnt")

    return upload_and_mount
