"""Helpers shared by every part's tests: a real S3-compatible server, the avafs CLI, ports.

Fixtures live in conftest.py; plain helpers live here so tests in any folder can import them
(pytest's `pythonpath` puts this folder on sys.path).
"""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.servers.ports import free_port, wait_for_port

AVAFS = [sys.executable, "-m", "avafs"]
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def write_aws_profile(path: Path, profile: str) -> Path:
    """An AWS config file (for AWS_CONFIG_FILE) whose profile `profile` holds the test
    server's keys."""
    path.write_text(f"[profile {profile}]\n"
                    f"aws_access_key_id = {TEST_CREDENTIALS['AWS_ACCESS_KEY_ID']}\n"
                    f"aws_secret_access_key = {TEST_CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n"
                    f"region = {TEST_CREDENTIALS['AWS_DEFAULT_REGION']}\n")
    return path


_TERMINAL_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
"""The colour codes newer werkzeug puts around a request line, even in a file."""


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
        text = _TERMINAL_COLOURS.sub("", self.log_path.read_text(errors="replace"))
        return [line.split('"')[1] for line in text.splitlines()
                if line.count('"') >= 2 and "HTTP/1.1" in line]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self._log.close()


def object_gets(server: S3Server, bucket: str) -> int:
    """Object GETs of `bucket` the server has answered so far (not its listings)."""
    return sum(1 for line in server.requests() if line.startswith(f"GET /{bucket}/")
               and "list-type" not in line and "prefix=" not in line)


def store_bytes(server: S3Server, bucket: str, key: str) -> bytes:
    """An object's bytes as the store has them, read past any mount."""
    return server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def store_keys(server: S3Server, bucket: str, prefix: str = "") -> set[str]:
    """Every key the store has under `prefix`, read past any mount."""
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                      Prefix=prefix)
    return {entry["Key"] for page in pages for entry in page.get("Contents", ())}


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
@dataclass(frozen=True)
class CodeBlock:
    """A fenced code block of a Markdown file and the marker comment on the line above it."""

    path: Path
    line: int
    language: str
    text: str
    marker: str
    """'excerpt', 'tested: TEST FILE', or '' (unmarked)."""


def code_blocks(path: Path) -> list[CodeBlock]:
    lines = path.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = re.match(r"^(```+)(\S*)\s*$", lines[index])
        if fence is None:
            index += 1
            continue
        end = next(number for number in range(index + 1, len(lines))
                   if lines[number].startswith(fence.group(1)))
        above = lines[index - 1].strip() if index else ""
        marker = re.fullmatch(r"<!-- (excerpt|tested: \S+) -->", above)
        blocks.append(CodeBlock(path, index + 1, fence.group(2),
                                "\n".join(lines[index + 1:end]) + "\n",
                                marker.group(1) if marker else ""))
        index = end + 1
    return blocks


def marked_block(path: Path, starting: str) -> str:
    """The text of the one block of `path` marked as tested whose first line is `starting`."""
    [block] = [block for block in code_blocks(path)
               if block.marker.startswith("tested:") and block.text.startswith(starting)]
    return block.text


EXAMPLE_HOSTS = ("coordinator", "minio")
"""Host names the READMEs' examples use, the loopback address inside `run_example`."""

_EXAMPLE_SCRIPT = """set -e
avafs_mounts() {{
  awk '$3 == "fuse.avafs" {{print $2}}' /proc/self/mounts
}}
ip link set lo up
for directory in /mnt /srv /var/lib /var/cache; do
  awk -v top="$directory" '$2 == top || index($2, top "/") == 1 {{print $2}}' /proc/self/mounts |
    sort -r | while read -r mounted; do umount -l "$mounted" 2>/dev/null || true; done
  mount -t tmpfs readme-example "$directory"
done
inherited=$(avafs_mounts)
cleanup() {{
  for mounted in $(avafs_mounts); do
    echo "$inherited" | grep -qxF "$mounted" || avafs umount --no-flush "$mounted" || true
  done
}}
trap cleanup EXIT
mount --bind {root}/hosts /etc/hosts
sbin=$(realpath /sbin)
mount -t overlay readme-helpers -o "lowerdir={root}/sbin:$sbin" "$sbin"
{setup}
cd {root}/work
{body}
"""


def run_example(root: Path, body: str, setup: str = "",
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a README example (shell) as written, in private mount and network namespaces.

    The examples name /mnt/..., /srv/..., /var/lib/..., the default cache dir under /var/cache
    and hosts such as `coordinator`: here tmpfs covers those directories, with the host's
    mounts under them (a user's own /mnt/imagenet, say) detached first, since `avafs mount`
    refuses a path the mount table names whatever covers it; /etc/hosts maps
    EXAMPLE_HOSTS to the loopback, and `avafs`, `python3` and the `mount.fuse.avafs` that
    mount(8) finds in /sbin are this interpreter, so the example touches nothing outside.
    `setup` (shell) runs first (in `root`); the example runs in `root/work`, and every avafs
    mount it made is unmounted at the end (the namespace's copies of other mounts are left
    alone). It runs in a PID namespace of its own, so whatever
    it left running in the background (a coordinator, a server) dies with it: such a process
    would otherwise hold the namespace's copies of other tests' FUSE mounts, and their daemons
    could not exit. Its TMPDIR is a folder of its own, removed after it, since what dies with
    the namespace leaves its temporary files behind (multiprocessing's pymp-* folders of a
    DataLoader's workers); a short path under /tmp, as the unix sockets made there need.
    """
    (root / "work").mkdir(parents=True, exist_ok=True)
    (root / "hosts").write_text(f"127.0.0.1 localhost {' '.join(EXAMPLE_HOSTS)}\n")
    commands, helpers = root / "bin", root / "sbin"
    for folder, name, arguments in ((commands, "avafs", "-m avafs"), (commands, "python3", ""),
                                    (helpers, "mount.fuse.avafs", "-m avafs.mount_helper")):
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(f'#!/bin/sh\nexec {sys.executable} {arguments} "$@"\n')
        (folder / name).chmod(0o755)
    script = _EXAMPLE_SCRIPT.format(root=root, setup=f"cd {root}\n{setup}", body=body)
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="avafs-example-") as temp:
        return subprocess.run(
            ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--propagation",
             "private", "sh", "-c", script],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, **(env or {}), "PATH": f"{commands}:{os.environ['PATH']}",
                 "PYTHONPATH": str(repo), "TMPDIR": temp})


def as_nobody(action: Callable[[], str]) -> str:
    """What `action` returns, run in a child process as uid and gid 65534 (no other groups),
    or the name and errno of the OSError it raised. A forked child, since the interpreter
    may be installed where that user cannot run it."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(reader)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            answer = action()
        except OSError as error:
            answer = f"{type(error).__name__} {error.errno}"
        os.write(writer, answer.encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(child, 0)
    return answer


def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A fixture's body: an HTTP server on loopback answering with `handler`, its base URL
    yielded, shut down after."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
