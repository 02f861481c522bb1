"""The cache dir is the mount owner's alone: another local user can read none of it (blocks,
not-yet-uploaded data, the log that names files, the control socket), whatever the umask the
mount was made with, and can reach the mount itself only when it was given with --allow-other."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import NOBODY, run_avafs, run_python_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")

SECRET = b"secret bytes " * 1000

PROBE = r"""
import os, socket, sys
cache, mnt = sys.argv[1], sys.argv[2]
def attempt(name, action):
    try:
        action()
        print(name, "READ")
    except PermissionError:
        print(name, "denied")
def read_every_file():
    found = [os.path.join(d, f) for d, _, fs in os.walk(cache, onerror=lambda e: (_ for _ in ()).throw(e)) for f in fs]
    if not found:
        raise PermissionError
    for path in found:
        open(path, "rb").read(1)
def connect():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.path.join(cache, "control.sock"))
attempt("cache-listing", lambda: os.listdir(cache))
attempt("cache-files", read_every_file)
attempt("log", lambda: open(os.path.join(cache, "avafs.log"), "rb").read())
attempt("socket", connect)
attempt("mount-listing", lambda: os.listdir(mnt))
attempt("mount-file", lambda: open(os.path.join(mnt, "clean.bin"), "rb").read())
"""


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory every user may traverse (pytest's own tmp dirs are 0700, which would make
    any check of what another user can read pass for the wrong reason)."""
    base = Path(tempfile.mkdtemp(prefix="avafs-private-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def mount_in_base(shared_base, mount):
    """`mount`, set up after `shared_base` so its mounts are gone before the base is removed:
    removing the base under a live mount would delete through the mount and leave the
    mountpoint behind in /tmp."""
    return mount


def _mount_with_umask_zero(mount, bucket: Path, base: Path, *args: str) -> tuple[Path, Path]:
    """Mount from a process whose umask is 0, so nothing is private by accident."""
    cache = base / "cache"
    mountpoint = base / "mnt"
    mountpoint.mkdir()
    os.chmod(mountpoint, 0o755)
    old = os.umask(0)
    try:
        mount(f"file://{bucket}", *args, mountpoint=mountpoint, cache_dir=cache)
    finally:
        os.umask(old)
    return cache, mountpoint


def _fill(mountpoint: Path) -> None:
    """Cache a clean file's blocks and leave a written one in the cache dir."""
    assert (mountpoint / "clean.bin").read_bytes() == SECRET
    with open(mountpoint / "written.bin", "wb") as file:
        file.write(SECRET)
        os.fsync(file.fileno())
    os.chmod(mountpoint / "written.bin", 0o600)


def _probe(cache: Path, mountpoint: Path) -> dict[str, str]:
    result = run_python_as(NOBODY, PROBE, str(cache), str(mountpoint))
    assert result.returncode == 0, result.stderr
    return dict(line.split() for line in result.stdout.splitlines())


@pytest.fixture
def secret_bucket(shared_base) -> Path:
    bucket = shared_base / "bucket"
    bucket.mkdir(mode=0o700)
    (bucket / "clean.bin").write_bytes(SECRET)
    return bucket


def _assert_private(cache: Path) -> None:
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    for directory, _, files in os.walk(cache):
        for name in files:
            mode = stat.S_IMODE(os.lstat(os.path.join(directory, name)).st_mode)
            assert mode & 0o077 == 0, f"{directory}/{name} is {oct(mode)}"


def test_another_user_reads_nothing_without_allow_other(mount_in_base, secret_bucket,
                                                        shared_base):
    cache, mountpoint = _mount_with_umask_zero(mount_in_base, secret_bucket, shared_base)
    _fill(mountpoint)

    seen = _probe(cache, mountpoint)

    assert seen == {name: "denied" for name in
                    ("cache-listing", "cache-files", "log", "socket", "mount-listing", "mount-file")}
    _assert_private(cache)


def test_allow_other_gives_the_mount_not_the_cache_dir(mount_in_base, secret_bucket,
                                                       shared_base):
    cache, mountpoint = _mount_with_umask_zero(mount_in_base, secret_bucket, shared_base,
                                               "--allow-other")
    _fill(mountpoint)

    seen = _probe(cache, mountpoint)

    assert seen["mount-listing"] == "READ"
    assert {name: seen[name] for name in ("cache-listing", "cache-files", "log", "socket")} == {
        name: "denied" for name in ("cache-listing", "cache-files", "log", "socket")}
    _assert_private(cache)


def test_a_loose_cache_dir_is_made_private_at_mount(mount_in_base, secret_bucket, shared_base):
    cache = shared_base / "cache"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    (cache / "avafs.log").write_text("an older mount's log\n")
    os.chmod(cache / "avafs.log", 0o644)

    _mount_with_umask_zero(mount_in_base, secret_bucket, shared_base)

    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / "avafs.log").stat().st_mode) == 0o600


def test_a_cache_dir_of_another_user_is_refused(secret_bucket, shared_base):
    cache = shared_base / "cache"
    cache.mkdir()
    os.chown(cache, NOBODY, NOBODY)
    mountpoint = shared_base / "mnt"
    mountpoint.mkdir()

    result = run_avafs("mount", f"file://{secret_bucket}", str(mountpoint), "--cache-dir",
                       str(cache))

    assert result.returncode != 0
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "belongs to uid 65534" in message and "--cache-dir" in message
    assert not os.listdir(cache)
    assert subprocess.run(["mountpoint", "-q", str(mountpoint)]).returncode != 0
