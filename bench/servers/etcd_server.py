"""A real single-member etcd (Debian's etcd-server) on free loopback ports, for the adapters'
coordinator and for cluster writes; it can be stopped and started again on the same ports and
data, as an etcd restart."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.servers.ports import free_port, wait_for_port


class EtcdServer:
    def __init__(self, data_dir: Path, name: str = "avafs-test") -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: apt-get install -y etcd-server")
        self.host = "127.0.0.1"
        self.port, peer_port = free_port(), free_port()
        self.client_url = f"http://{self.host}:{self.port}"
        peer_url = f"http://{self.host}:{peer_port}"
        self.data_dir = data_dir
        self.args = [binary, "--name", name, "--data-dir", str(data_dir / "data"),
                     "--listen-client-urls", self.client_url,
                     "--advertise-client-urls", self.client_url,
                     "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                     "--initial-cluster", f"{name}={peer_url}"]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """As the adapters' coordinator takes it."""
        return f"etcd://{self.host}:{self.port}"

    def start(self) -> None:
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
