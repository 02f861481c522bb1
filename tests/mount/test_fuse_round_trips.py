"""The requests the kernel sends the daemon per file read, as strace sees the daemon read them
from /dev/fuse: each is a round trip, and they bound the small files a second a mount serves."""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyfuse3
import pytest

from avafs.fuse.kernel import PARALLEL_LOOKUPS

pytestmark = [
    pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (scripts/install.sh)"),
    pytest.mark.skipif(not hasattr(pyfuse3.FileInfo(), "noflush"),
                       reason="stock pyfuse3: scripts/build_pyfuse3.sh builds the one with noflush"),
]

OPENS = 50
FUSE_LOOKUP = 1
FUSE_GETATTR = 3
FUSE_OPEN = 14
FUSE_READ = 15
FUSE_RELEASE = 18
FUSE_FLUSH = 25
FUSE_OPENDIR = 27
FUSE_READDIRPLUS = 44


def _daemon_pid(mountpoint: Path) -> int:
    return int(os.getxattr(mountpoint, "user.avafs.pid"))


def _fuse_fds(pid: int) -> set[int]:
    return {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse"}


def _requests_while(pid: int, action, trace: Path) -> collections.Counter[int]:
    """The FUSE opcodes the daemon read from /dev/fuse while `action` ran (each request
    starts with its length and opcode, two little-endian 32-bit words)."""
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-x", "-s", "8", "-e", "trace=read",
                               "-o", str(trace), "-p", str(pid)])
    deadline = time.monotonic() + 10
    while f"TracerPid:\t{tracer.pid}\n" not in Path(f"/proc/{pid}/status").read_text():
        if time.monotonic() > deadline:
            raise AssertionError("strace did not attach")
        time.sleep(0.05)
    time.sleep(0.5)  # the main thread first, then every other
    try:
        action()
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    fds = _fuse_fds(pid)
    opcodes: collections.Counter[int] = collections.Counter()
    for found in re.finditer(r'read\((\d+), "((?:\\x[0-9a-f]{2}){8})', trace.read_text()):
        if int(found[1]) in fds:
            header = bytes.fromhex(found[2].replace("\\x", ""))
            opcodes[int.from_bytes(header[4:8], "little")] += 1
    return opcodes


def _read_again(path: Path) -> None:
    for _ in range(OPENS):
        with open(path, "rb") as reader:
            reader.read()


def test_closing_a_reader_sends_no_flush(local_bucket, mount, tmp_path):
    (local_bucket / "sample.bin").write_bytes(os.urandom(4096))
    mnt = mount(f"file://{local_bucket}")
    path = mnt / "sample.bin"
    path.read_bytes()  # the lookup, and the bytes into the page cache

    requests = _requests_while(_daemon_pid(mnt), lambda: _read_again(path), tmp_path / "trace")
    assert requests[FUSE_OPEN] == OPENS, requests
    assert requests[FUSE_FLUSH] == 0, requests


@pytest.mark.skipif(not getattr(pyfuse3, "READS_NAME_INODE_WITHOUT_OPEN", False),
                    reason="stock pyfuse3: reads without an open cannot name their file")
def test_a_read_only_mount_serves_a_file_read_again_from_the_kernel(local_bucket, mount,
                                                                    tmp_path):
    (local_bucket / "sample.bin").write_bytes(os.urandom(300 * 1024))
    mnt = mount(f"file://{local_bucket}", "--read-only")
    path = mnt / "sample.bin"
    assert path.read_bytes() == (local_bucket / "sample.bin").read_bytes()

    requests = _requests_while(_daemon_pid(mnt), lambda: _read_again(path), tmp_path / "trace")
    for opcode in (FUSE_OPEN, FUSE_READ, FUSE_FLUSH, FUSE_RELEASE):
        assert requests[opcode] == 0, requests


@pytest.mark.skipif(not PARALLEL_LOOKUPS, reason="lookups in one directory go one at a time "
                    "(libfuse older than 3.16): a GETATTR reads a file's attributes instead")
def test_a_file_opened_by_path_is_described_by_its_lookup(s3_server, bucket, s3_mount,
                                                          tmp_path):
    """With parallel lookups a LOOKUP may wait for the store: it reads the attributes a
    listing lacks (an S3 listing carries no metadata), and the open that follows needs no
    GETATTR."""
    names = [f"{i:02d}.bin" for i in range(OPENS)]
    client = s3_server.client()
    for name in names:
        client.put_object(Bucket=bucket, Key=name, Body=os.urandom(8192))
    mnt = s3_mount()

    def open_each() -> None:
        for name in names:
            with open(mnt / name, "rb") as reader:
                assert len(reader.read()) == 8192

    requests = _requests_while(_daemon_pid(mnt), open_each, tmp_path / "trace")
    assert (requests[FUSE_LOOKUP], requests[FUSE_OPEN]) == (OPENS, OPENS), requests
    assert requests[FUSE_GETATTR] == 0, requests


@pytest.mark.skipif(not hasattr(pyfuse3.FileInfo(), "cache_readdir"),
                    reason="stock pyfuse3: opendir cannot turn the kernel's readdir cache on")
def test_a_directory_read_again_is_answered_by_the_kernel(local_bucket, mount, tmp_path):
    """Its entries are many READDIRPLUS replies the first time, none while it is unchanged."""
    (local_bucket / "d").mkdir()
    names = [f"{i:04d}.bin" for i in range(300)]
    for name in names:
        (local_bucket / "d" / name).write_bytes(b"x")
    mnt = mount(f"file://{local_bucket}", "--metadata-ttl", "3600")
    assert sorted(os.listdir(mnt / "d")) == names

    def list_again() -> None:
        for _ in range(OPENS):
            assert len(os.listdir(mnt / "d")) == len(names)

    requests = _requests_while(_daemon_pid(mnt), list_again, tmp_path / "trace")
    assert requests[FUSE_OPENDIR] == OPENS, requests
    assert requests[FUSE_READDIRPLUS] == 0, requests
