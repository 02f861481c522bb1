"""A kubelet stand-in for the CSI driver's tests: the real driver process, real sockets, mounts.

`driver` runs `python -m csi_driver` exactly as the DaemonSet does, with no AWS credentials
in its environment, so a volume can reach its bucket only through the secrets the test sends.
`kubelet` speaks CSI to it over its Unix socket and lays out directories the way kubelet
does. Whatever a test mounts under its tmp_path is unmounted at teardown, daemons included,
even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from csi_driver.proto import csi_pb2, csi_pb2_grpc

AWS_KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MODE = csi_pb2.VolumeCapability.AccessMode


@dataclass(frozen=True)
class Mount:
    """A /proc/self/mountinfo line, parsed here independently of the driver's own parser."""

    mount_point: str
    root: str
    device: str
    options: tuple[str, ...]
    fstype: str


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts_under(root: Path) -> list[Mount]:
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            separator = fields.index("-")
            mount = Mount(mount_point=_unescape(fields[4]), root=_unescape(fields[3]),
                          device=fields[2], options=tuple(fields[5].split(",")),
                          fstype=fields[separator + 1])
            if mount.mount_point == str(root) or mount.mount_point.startswith(f"{root}/"):
                found.append(mount)
    return found


def mounts_at(path: Path) -> list[Mount]:
    return [mount for mount in mounts_under(path) if mount.mount_point == str(path)]


def live_daemon_pids(root: Path) -> list[int]:
    """Live avafs daemons of the cache dirs below `root` (read from their avafs.pid)."""
    pids = []
    for pid_file in root.rglob("avafs.pid"):
        try:
            pid = int(pid_file.read_text())
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if b"avafs" in command_line and str(pid_file.parent).encode() in command_line:
            pids.append(pid)
    return pids


def release_everything_under(root: Path) -> None:
    """Unmount every mount below `root` (pods' binds first, then FUSE mounts), end daemons.

    `avafs umount` first, so daemons flush and exit on their own; whatever does not go that
    way within 30 s (a failing upload is retried forever) is detached and killed.
    """
    for mount in reversed(mounts_under(root)):
        if "/pods/" in mount.mount_point:
            subprocess.run(["umount", "-l", mount.mount_point], capture_output=True)
    for mount in mounts_under(root):
        if mount.fstype == "fuse.avafs":
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([sys.executable, "-m", "avafs", "umount", mount.mount_point],
                               capture_output=True, timeout=30)
    for _ in range(3):
        for mount in reversed(mounts_under(root)):
            subprocess.run(["umount", "-l", mount.mount_point], capture_output=True)
    for pid in live_daemon_pids(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not mounts_under(root), f"left mounted: {mounts_under(root)}"


class DriverProcess:
    """`python -m csi_driver` with its socket, state dir and log under one directory."""

    def __init__(self, root: Path, repair_interval: float, allow_file_sources: bool = True,
                 mode: str = "node") -> None:
        self.root = root
        self.socket = root / "csi.sock"
        self.state_dir = root / "state"
        self.cache_root = self.state_dir / "cache"
        self.log_path = root / "driver.log"
        self.repair_interval = repair_interval
        self.allow_file_sources = allow_file_sources
        self.mode = mode
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {name: value for name, value in os.environ.items() if name not in AWS_KEY_VARIABLES}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "csi_driver", "--endpoint", f"unix://{self.socket}",
                 "--mode", self.mode, "--node-id", "node-1", "--state-dir", str(self.state_dir),
                 "--max-volumes-per-node", "16", "--log-level", "debug",
                 "--repair-interval", str(self.repair_interval),
                 *(["--allow-file-sources"] if self.allow_file_sources else [])],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + 60
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            identity = csi_pb2_grpc.IdentityStub(channel)
            while time.monotonic() < deadline:
                assert self.process.poll() is None, f"driver exited:\n{self.log()}"
                if self._ready(identity):
                    return
                time.sleep(0.1)
        raise TimeoutError(f"driver not ready after 60s:\n{self.log()}")

    @staticmethod
    def _ready(identity: csi_pb2_grpc.IdentityStub) -> bool:
        """Probe says ready; before the socket exists the call fails, which means "not yet"."""
        try:
            return identity.Probe(csi_pb2.ProbeRequest(), timeout=5).ready.value
        except grpc.RpcError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def live_daemons(self) -> list[int]:
        return live_daemon_pids(self.cache_root)

    def daemon_pid(self) -> int:
        """The pid of the one volume daemon this driver runs."""
        pids = self.live_daemons()
        assert len(pids) == 1, f"expected one avafs daemon, found {pids}"
        return pids[0]


class Kubelet:
    """Drives the plugin the way kubelet does, with kubelet's directory layout."""

    def __init__(self, socket: Path, root: Path) -> None:
        self.root = root
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.controller = csi_pb2_grpc.ControllerStub(self.channel)

    def staging_path(self, volume_id: str) -> Path:
        """Kubelet creates the staging directory itself before NodeStageVolume."""
        path = self.root / "plugins" / "kubernetes.io" / "csi" / "csi.avafs.io" / volume_id / "globalmount"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def target_path(self, pod: str, volume_id: str) -> Path:
        """Kubelet creates the parent; the plugin creates (and removes) the target itself."""
        parent = self.root / "pods" / pod / "volumes" / "kubernetes.io~csi" / volume_id
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "mount"

    @staticmethod
    def capability(mode: int = MODE.MULTI_NODE_MULTI_WRITER) -> csi_pb2.VolumeCapability:
        return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                        access_mode=MODE(mode=mode))

    def stage(self, volume_id: str, attributes: dict[str, str],
              secrets: dict[str, str] | None = None, mode: int = MODE.MULTI_NODE_MULTI_WRITER,
              staging_path: Path | None = None) -> Path:
        staging_path = staging_path or self.staging_path(volume_id)
        self.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
            volume_id=volume_id, staging_target_path=str(staging_path),
            volume_capability=self.capability(mode), volume_context=attributes,
            secrets=secrets or {}), timeout=150)
        return staging_path

    def publish(self, volume_id: str, target_path: Path, attributes: dict[str, str],
                readonly: bool = False, mode: int = MODE.MULTI_NODE_MULTI_WRITER) -> None:
        self.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id, staging_target_path=str(self.staging_path(volume_id)),
            target_path=str(target_path), volume_capability=self.capability(mode),
            readonly=readonly, volume_context=attributes), timeout=150)

    def unpublish(self, volume_id: str, target_path: Path) -> None:
        self.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=volume_id, target_path=str(target_path)), timeout=60)

    def unstage(self, volume_id: str) -> None:
        self.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
            volume_id=volume_id, staging_target_path=str(self.staging_path(volume_id))),
            timeout=150)

    def stats(self, volume_id: str, path: Path) -> csi_pb2.NodeGetVolumeStatsResponse:
        return self.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(
            volume_id=volume_id, volume_path=str(path)), timeout=30)


def kill_and_wait(pid: int) -> None:
    """kill -9, then wait until the process is gone (a zombie has no command line left)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            return
        time.sleep(0.02)
    raise TimeoutError(f"process {pid} survived SIGKILL")


@pytest.fixture
def kill9() -> Callable[[int], None]:
    return kill_and_wait


class MountInfo:
    """What the kernel has mounted, for assertions: `.at(path)`, `.under(directory)`."""

    at = staticmethod(mounts_at)
    under = staticmethod(mounts_under)


@pytest.fixture
def mountinfo() -> MountInfo:
    return MountInfo()


@pytest.fixture
def node_root(tmp_path: Path) -> Iterator[Path]:
    """Everything of one simulated node; torn down (mounts, daemons) after the test."""
    root = tmp_path / "node"
    root.mkdir()
    yield root
    release_everything_under(root)


@pytest.fixture
def start_driver(node_root: Path) -> Iterator[Callable[..., DriverProcess]]:
    """start_driver(repair_interval=0) starts a driver (again) on this node's state dir;
    `mode="all"` adds the Controller service."""
    started: list[DriverProcess] = []

    def start(repair_interval: float = 0, allow_file_sources: bool = True,
              mode: str = "node") -> DriverProcess:
        driver = DriverProcess(node_root / "driver", repair_interval, allow_file_sources, mode)
        driver.root.mkdir(exist_ok=True)
        started.append(driver)
        driver.start()
        return driver

    yield start
    for driver in started:
        driver.stop()


@pytest.fixture
def driver(start_driver: Callable[..., DriverProcess]) -> DriverProcess:
    return start_driver()


@pytest.fixture
def connect(node_root: Path) -> Iterator[Callable[[DriverProcess], Kubelet]]:
    """connect(driver) gives a kubelet talking to that driver process."""
    clients: list[Kubelet] = []

    def make(driver: DriverProcess) -> Kubelet:
        clients.append(Kubelet(driver.socket, node_root / "kubelet"))
        return clients[-1]

    yield make
    for client in clients:
        client.channel.close()


@pytest.fixture
def kubelet(driver: DriverProcess, connect: Callable[[DriverProcess], Kubelet]) -> Kubelet:
    return connect(driver)


@dataclass(frozen=True)
class Dataset:
    attributes: dict[str, str]
    """volumeAttributes of a PersistentVolume for alice's part of the bucket."""
    objects: dict[str, bytes]
    """Everything in the bucket, by key."""

    def visible_to_alice(self) -> dict[str, bytes]:
        prefix = self.attributes["subPath"] + "/"
        return {key[len(prefix):]: body for key, body in self.objects.items()
                if key.startswith(prefix)}


@pytest.fixture
def s3_dataset(s3_server, bucket: str) -> Dataset:
    """A bucket with a dataset for two users on the test S3 server."""
    objects = {
        "team/alice/images/0001.bin": os.urandom(3 * 2**20 + 17),
        "team/alice/labels.txt": b"cat\ndog\n",
        "team/bob/private.txt": b"bob only\n",
        "README": b"top level\n",
    }
    client = s3_server.client()
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return Dataset({"source": f"s3://{bucket}", "endpointUrl": s3_server.endpoint,
                    "region": "us-east-1", "subPath": "team/alice", "ramCache": "64MiB",
                    "blockSize": "1MiB", "metadataTtl": "30"}, objects)


@pytest.fixture
def file_volume(tmp_path: Path) -> dict[str, str]:
    """A file:// bucket (no S3 server needed) and the volumeAttributes of its volume."""
    bucket = tmp_path / "bucket"
    (bucket / "users" / "alice").mkdir(parents=True)
    (bucket / "users" / "alice" / "notes.txt").write_text("alice's notes\n")
    (bucket / "users" / "bob").mkdir(parents=True)
    (bucket / "users" / "bob" / "notes.txt").write_text("bob's notes\n")
    (bucket / "shared.txt").write_text("for everyone\n")
    return {"source": f"file://{bucket}", "subPath": "users/alice"}


def _shared_driver(tmp_path_factory, mode: str) -> Iterator[Kubelet]:
    root = tmp_path_factory.mktemp("node")
    driver = DriverProcess(root / "driver", repair_interval=0, mode=mode)
    driver.root.mkdir()
    client = None
    try:
        driver.start()
        client = Kubelet(driver.socket, root / "kubelet")
        yield client
    finally:
        if client is not None:
            client.channel.close()
        driver.stop()
        release_everything_under(root)


@pytest.fixture(scope="module")
def shared_kubelet(tmp_path_factory) -> Iterator[Kubelet]:
    """One driver for a whole module of tests that mount nothing (request checking)."""
    yield from _shared_driver(tmp_path_factory, "node")


@pytest.fixture(scope="module")
def shared_all_mode(tmp_path_factory) -> Iterator[Kubelet]:
    """One driver in `all` mode for a module's request checks."""
    yield from _shared_driver(tmp_path_factory, "all")
