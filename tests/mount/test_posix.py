"""POSIX that training jobs and their tools use, on real mounts: no request can end the daemon,
symbolic links and special files kept as objects, names the store cannot hold refused up front.

Directory attributes and times are in test_attributes.py."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from support import run_avafs

from avafs.client import Client

HUGE = 999_999_999_999_999
"""A size no cache file system holds (ext4's limit is 16 TiB): ftruncate gets EFBIG."""


def _alive(mnt: Path) -> None:
    """The daemon still answers, with what it had."""
    assert (mnt / "witness").read_bytes() == b"still here"


@pytest.fixture(params=["s3", "file"])
def writable(request, s3_mount, mount, local_bucket) -> Path:
    """A writable mount of a fresh bucket, on moto and on a local directory."""
    if request.param == "s3":
        mnt = s3_mount()
    else:
        mnt = mount(local_bucket.as_uri(), "--writeback-delay", "0.2")
    (mnt / "witness").write_bytes(b"still here")
    return mnt


def test_a_truncate_or_write_past_the_largest_file_is_efbig_and_changes_nothing(writable):
    (writable / "f").write_bytes(b"data")
    for command in (["truncate", "-s", str(HUGE), "f"],
                    ["dd", "if=/dev/zero", "of=f", "bs=1", "count=1", f"seek={HUGE}",
                     "conv=notrunc"]):
        failed = subprocess.run(command, cwd=writable, capture_output=True, text=True)
        assert failed.returncode != 0 and "File too large" in failed.stderr
        _alive(writable)
    with open(writable / "f", "r+b") as file:
        with pytest.raises(OSError) as refused:
            os.truncate(file.fileno(), HUGE)
        assert refused.value.errno == errno.EFBIG
    assert (writable / "f").read_bytes() == b"data"
    assert os.stat(writable / "f").st_size == 4
    assert Client(writable).flush()["bytes"] == 0
    assert (writable / "f").read_bytes() == b"data"


def test_names_the_store_cannot_hold_are_refused_and_flush_returns(s3_mount, mount, tmp_path):
    deep = tmp_path / ("d" * 250) / ("e" * 250) / ("f" * 250)
    deep.mkdir(parents=True)
    local = mount(deep.as_uri(), "--writeback-delay", "0")
    s3 = s3_mount(cache_dir=tmp_path / "s3-cache")
    # Within the mount's own limits (255 bytes a name), beyond the store's: S3's 1,024-byte
    # keys, and PATH_MAX for the bucket directory's path.
    for mnt, depth in ((local, 15), (s3, 5)):
        (mnt / "witness").write_bytes(b"still here")
        path = mnt
        for level in range(depth):
            path = path / f"{level:02d}{'x' * 240}"
            try:
                path.mkdir()
            except OSError as error:
                assert error.errno == errno.ENAMETOOLONG
                break
        else:
            pytest.fail(f"{depth} levels of 242-byte names were accepted by {mnt}")
        with pytest.raises(OSError) as refused:
            (path.parent / ("y" * 250)).write_bytes(b"never")
        assert refused.value.errno == errno.ENAMETOOLONG
        _alive(mnt)
        flushed = run_avafs("flush", str(mnt), timeout=60)
        assert flushed.returncode == 0, flushed.stderr


def test_a_file_the_local_bucket_refuses_for_good_is_set_aside(mount, local_bucket):
    mnt = mount(local_bucket.as_uri(), "--writeback-delay", "3")
    (mnt / "witness").write_bytes(b"still here")
    (mnt / "run").mkdir()
    (mnt / "run" / "log.txt").write_bytes(b"kept")
    (local_bucket / "run").write_bytes(b"another tool put a file where the directory goes")
    flushed = run_avafs("flush", str(mnt), timeout=60)
    assert flushed.returncode == 1
    assert "run/log.txt" in flushed.stdout + flushed.stderr
    assert (mnt / "run" / "log.txt").read_bytes() == b"kept"  # still readable, kept locally
    _alive(mnt)


def test_symlinks_round_trip_through_a_remount_on_an_empty_cache(s3_server, bucket, s3_mount,
                                                                  tmp_path):
    mnt = s3_mount()
    (mnt / "checkpoint-1200").mkdir()
    (mnt / "checkpoint-1200" / "model.pt").write_bytes(b"weights")
    os.symlink("checkpoint-1200", mnt / "checkpoint-latest")
    os.symlink("/etc/passwd", mnt / "absolute")
    os.symlink("nowhere/at/all", mnt / "dangling")
    with pytest.raises(FileExistsError):
        os.symlink("other", mnt / "dangling")
    assert Client(mnt).flush()["bytes"] == 0

    stored = s3_server.client().get_object(Bucket=bucket, Key="checkpoint-latest")
    assert stored["Body"].read() == b"checkpoint-1200"
    assert int(stored["Metadata"]["mode"]) == stat.S_IFLNK | 0o777  # as s3fs keeps links
    fresh = s3_mount(mountpoint=tmp_path / "again", cache_dir=tmp_path / "again-cache")
    for view in (mnt, fresh):
        assert sorted(os.listdir(view)) == ["absolute", "checkpoint-1200", "checkpoint-latest",
                                            "dangling"]
        assert os.readlink(view / "checkpoint-latest") == "checkpoint-1200"
        assert os.readlink(view / "absolute") == "/etc/passwd"
        assert os.readlink(view / "dangling") == "nowhere/at/all"
        link = os.lstat(view / "checkpoint-latest")
        assert stat.S_ISLNK(link.st_mode) and link.st_size == len("checkpoint-1200")
        assert (view / "checkpoint-latest" / "model.pt").read_bytes() == b"weights"
        assert (view / "absolute").read_bytes() == Path("/etc/passwd").read_bytes()
        assert not (view / "dangling").exists()
    os.unlink(fresh / "checkpoint-latest")
    os.symlink("checkpoint-1200/model.pt", fresh / "checkpoint-latest")
    assert (fresh / "checkpoint-latest").read_bytes() == b"weights"


def test_links_other_s3_tools_wrote_read_as_links(s3_server, bucket, s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="data.bin", Body=b"payload")
    s3_server.client().put_object(Bucket=bucket, Key="alias", Body=b"data.bin",
                                  Metadata={"mode": str(stat.S_IFLNK | 0o777)})
    mnt = s3_mount()
    assert sorted(os.listdir(mnt)) == ["alias", "data.bin"]
    assert os.readlink(mnt / "alias") == "data.bin"
    assert (mnt / "alias").read_bytes() == b"payload"


def test_symlinks_in_a_local_bucket_are_local_links_never_followed(mount, local_bucket):
    (local_bucket / "real.txt").write_bytes(b"real")
    os.symlink("real.txt", local_bucket / "existing-link")
    mnt = mount(local_bucket.as_uri(), "--writeback-delay", "0")
    assert os.readlink(mnt / "existing-link") == "real.txt"
    os.symlink("../outside", mnt / "made-here")
    Client(mnt).flush()
    assert os.readlink(local_bucket / "made-here") == "../outside"
    os.rename(mnt / "made-here", mnt / "renamed")
    Client(mnt).flush()
    assert os.readlink(local_bucket / "renamed") == "../outside"


def test_links_across_sources_are_resolved_by_the_kernel(s3_server, bucket, mount, s3_env,
                                                         local_bucket, tmp_path):
    (local_bucket / "labels.json").write_bytes(b"{}")
    config = tmp_path / "avafs.yaml"
    config.write_text(f"namespace:\n  images: s3://{bucket}\n  meta: {local_bucket.as_uri()}\n"
                      f"endpoint_url: {s3_server.endpoint}\n")
    mnt = mount("--config", str(config))
    os.symlink("../meta/labels.json", mnt / "images" / "labels.json")
    assert (mnt / "images" / "labels.json").read_bytes() == b"{}"
    assert os.readlink(mnt / "images" / "labels.json") == "../meta/labels.json"


def test_fifos_and_sockets_are_kept_and_served_by_the_kernel(writable):
    os.mkfifo(writable / "pipe", 0o640)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append((writable / "pipe").read_bytes()))
    reader.start()
    (writable / "pipe").write_bytes(b"through the kernel")
    reader.join(timeout=10)
    assert received == [b"through the kernel"]
    os.mknod(writable / "sock", stat.S_IFSOCK | 0o600)
    os.mknod(writable / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert Client(writable).flush()["bytes"] == 0
    shown = {name: os.lstat(writable / name) for name in ("pipe", "sock", "null")}
    assert stat.S_ISFIFO(shown["pipe"].st_mode) and stat.S_IMODE(shown["pipe"].st_mode) == 0o640
    assert stat.S_ISSOCK(shown["sock"].st_mode)
    assert stat.S_ISCHR(shown["null"].st_mode) and shown["null"].st_rdev == os.makedev(1, 3)
    with pytest.raises(OSError) as refused:
        os.link(writable / "witness", writable / "second-name")
    assert refused.value.errno == errno.ENOTSUP
    _alive(writable)
