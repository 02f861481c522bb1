"""Fixtures shared by every part's tests: a real S3-compatible server and real avafs mounts.

The tests are in rooms by kind: `unit/` needs neither root nor FUSE (it may start servers on
loopback), `mount/` mounts for real (root, /dev/fuse), `docs/` checks the documents and the
code's layout against each other, and each sub-product (`csi/`, `adapters/`, `gpu_sched/`) has
its own. A test is marked `mount` by its folder (`mount/`), by a fixture that mounts
(MOUNTING_FIXTURES), or by its own `pytestmark`, so `-m "not mount"` runs the rest alone.

The S3 side is moto's standalone HTTP server on a free loopback port (or, where a test needs a
fast store or a cluster, SeaweedFS from seaweed.py), reached through the same
boto3 code that talks to AWS. Mounts are made through the `avafs` command line, exactly as a user
makes them, and torn down even when a test fails.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from local_writeback import LocalWriteSide
from support import AVAFS, TEST_CREDENTIALS, S3Server, unmount

from bench.servers.etcd_server import EtcdServer
from bench.servers.fault_proxy import FaultProxy
from bench.servers.seaweed import SeaweedCluster

MOUNTING_FIXTURES = frozenset({"mount", "s3_mount", "mounted_bucket", "driver", "kubelet",
                               "start_driver"})
"""Fixtures that make a FUSE mount, or start a CSI driver that makes them."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.fspath).parent.name == "mount" or \
                MOUNTING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.mount)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("moto") / "access.log")
    yield server
    server.stop()


@pytest.fixture
def seaweed_cluster(tmp_path) -> Iterator[SeaweedCluster]:
    """A SeaweedFS cluster of this test's own: master, two volume servers keeping every
    object on both (replication 001), filer and S3 gateway, on free loopback ports; a test
    may kill and restart a volume server (`kill_volume`, `restart_volumes`)."""
    cluster = SeaweedCluster(tmp_path / "seaweed", volume_servers=2, replication="001")
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory) -> Iterator[EtcdServer]:
    """A real etcd shared by the session's tests (each uses keys of its own)."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_etcd(tmp_path) -> Iterator[EtcdServer]:
    """A real etcd of this test's own, which it may stop and start again."""
    server = EtcdServer(tmp_path / "etcd")
    server.data_dir.mkdir()
    server.start()
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
def s3_mount(s3_server, bucket, mount) -> Callable[..., Path]:
    """s3_mount(*args, endpoint=None, **mount_kwargs): a mount of the test bucket with a short
    write-back delay, through `endpoint` (a fault proxy) if given."""
    def _mount(*args: str, endpoint: str | None = None, **kwargs) -> Path:
        return mount(f"s3://{bucket}", "--endpoint-url", endpoint or s3_server.endpoint,
                     "--writeback-delay", "0.2", *args, **kwargs)
    return _mount


@pytest.fixture
def proxy(s3_server) -> Iterator[FaultProxy]:
    """A fault-injecting TCP proxy in front of the S3 server (modes: pass, 503, refuse, cut)."""
    server = FaultProxy(s3_server.port)
    yield server
    server.close()


@pytest.fixture
def local_bucket(tmp_path) -> Path:
    """A directory used as a file:// bucket."""
    path = tmp_path / "bucket"
    path.mkdir()
    return path


@pytest.fixture(scope="session", autouse=True)
def _fuse_available() -> None:
    if not Path("/dev/fuse").exists() or shutil.which("fusermount3") is None:
        pytest.exit("avafs tests need /dev/fuse and fusermount3 (apt-get install fuse3)", 2)


@pytest.fixture
def side(tmp_path) -> Iterator[LocalWriteSide]:
    """A namespace over a write-back over a local bucket, driven as the FUSE handlers drive them, with
    no mount (tests/local_writeback.py)."""
    made = LocalWriteSide(tmp_path)
    yield made
    made.close()
