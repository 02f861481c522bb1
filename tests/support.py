"""Helpers shared by every part's tests: a real S3-compatible server, the avafs CLI, ports.

Fixtures live in conftest.py; plain helpers live here so tests in any folder can import them
(pytest's `pythonpath` puts this folder on sys.path).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

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


def run_avafs(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(AVAFS + list(args), capture_output=True, text=True, timeout=timeout,
                          **kwargs)


NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
"""An interpreter any user may run (this one may live under root's 0700 home); stdlib only."""


def run_python_as(uid: int, code: str, *args: str, gid: int | None = None,
                  timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `python3 -c code args...` as another user (this process must be root), the way a
    second local user or a non-root pod would touch the mount and its files."""
    group = uid if gid is None else gid

    def drop_privileges() -> None:
        os.setgroups([])
        os.setgid(group)
        os.setuid(uid)

    return subprocess.run([SYSTEM_PYTHON, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=drop_privileges, cwd="/")
