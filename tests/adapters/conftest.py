"""Fixtures for the adapter tests: real coordinator services (the real etcd is tests/conftest.py's
`etcd`).

Every process started here is stopped at teardown, even when a test fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from adapters_testlib import (  # noqa: E402 - needs the path above
    REPO,
    CoordinatorService,
)


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
