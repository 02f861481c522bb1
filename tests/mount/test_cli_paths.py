"""Paths a user gives are the caller's paths, and default cache dirs do not collide.

The daemon runs from /, so every relative path (mountpoint, --config, --cache-dir, --log-file,
a manifest) must be resolved before it starts; a mount with defaults gets a cache dir of its own
per source.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import is_mounted, run_avafs, run_example, unmount


@pytest.fixture
def workdir(tmp_path, local_bucket) -> Path:
    """A working directory holding `mnt/` and `bucket/` with one file."""
    (local_bucket / "hello.txt").write_text("hello")
    (tmp_path / "mnt").mkdir()
    yield tmp_path
    unmount(tmp_path / "mnt")


def test_relative_mountpoint_and_cache_dir(workdir, local_bucket):
    result = run_avafs("mount", local_bucket.as_uri(), "mnt", "--cache-dir", "cache1",
                       cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert is_mounted(workdir / "mnt")
    assert (workdir / "mnt" / "hello.txt").read_text() == "hello"
    assert (workdir / "cache1" / "avafs.log").exists()
    assert not Path("/cache1").exists()


def test_relative_config_and_its_cache_dir(workdir, local_bucket):
    (workdir / "conf").mkdir()
    (workdir / "conf" / "avafs.yaml").write_text(
        f"namespace:\n  data: {local_bucket.as_uri()}\ncache_dir: cache2\n")
    result = run_avafs("mount", "--config", "conf/avafs.yaml", "mnt", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "mnt" / "data" / "hello.txt").read_text() == "hello"
    assert (workdir / "conf" / "cache2" / "avafs.log").exists()


def test_relative_manifest(workdir, local_bucket):
    assert run_avafs("mount", local_bucket.as_uri(), "mnt", "--cache-dir", "cache",
                     cwd=workdir).returncode == 0
    (workdir / "list.jsonl").write_text(json.dumps({"path": "hello.txt"}) + "\n")
    result = run_avafs("warmup", "--manifest", "list.jsonl", "--mount", "mnt", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "1 files" in result.stdout


def test_relative_file_url_gets_the_absolute_one(workdir, local_bucket):
    result = run_avafs("mount", "file://bucket", "mnt", "--cache-dir", "c", cwd=workdir)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"avafs: error: invalid source 'file://bucket': a local bucket is file:///absolute/dir "
        f"(did you mean {local_bucket.as_uri()}?)")
    result = run_avafs("mount", "bucket", "mnt", "--cache-dir", "c", cwd=workdir)
    assert f"did you mean {local_bucket.as_uri()}?" in result.stderr


def test_two_mounts_with_default_cache_dirs(tmp_path):
    """Two buckets mounted with default settings both work, each with its own cache dir."""
    mounted, cache_dirs = [], []
    try:
        for name in ("one", "two"):
            bucket = tmp_path / f"bucket-{name}"
            bucket.mkdir()
            (bucket / "f").write_text(name)
            mountpoint = tmp_path / f"mnt-{name}"
            mountpoint.mkdir()
            result = run_avafs("mount", bucket.as_uri(), str(mountpoint))
            assert result.returncode == 0, result.stderr
            mounted.append(mountpoint)
            status = json.loads(run_avafs("status", "--json", str(mountpoint)).stdout)
            cache_dirs.append(Path(status["cache_dir"]))
        assert [(path / "f").read_text() for path in mounted] == ["one", "two"]
        assert cache_dirs[0] != cache_dirs[1]
        assert all("bucket-" in path.name for path in cache_dirs)
    finally:
        for path in mounted:
            unmount(path)
        for path in cache_dirs:
            shutil.rmtree(path, ignore_errors=True)


def test_writes_left_in_the_old_shared_default_cache_dir_are_pointed_out(tmp_path, local_bucket):
    """Before each set of sources had a default cache dir of its own, every mount used the root
    one; writes journaled there are uploaded only by a mount that names it, so say so."""
    body = f"""mkdir -p /var/cache/avafs/writeback/data mnt
touch /var/cache/avafs/writeback/data/left-over
avafs mount {local_bucket.as_uri()} mnt 2> warning.txt
avafs umount mnt
cat warning.txt
"""
    result = run_example(tmp_path / "example", body)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "avafs: warning: /var/cache/avafs, the cache dir every mount used by default before, "
        "holds 1 files not yet uploaded: mount its sources once with --cache-dir "
        "/var/cache/avafs to upload them")


def test_log_file_relative_to_the_caller_and_one_line_when_it_cannot_be_opened(workdir,
                                                                               local_bucket):
    result = run_avafs("mount", local_bucket.as_uri(), "mnt", "--cache-dir", "cache",
                       "--log-file", "logs/mount.log", cwd=workdir)
    assert result.returncode == 1
    assert result.stderr == (f"avafs: error: cannot open log file {workdir}/logs/mount.log: No "
                             "such file or directory: give --log-file a file in a directory "
                             "this user can write\n")
    assert not (workdir / "cache").exists()

    (workdir / "logs").mkdir()
    result = run_avafs("mount", local_bucket.as_uri(), "mnt", "--cache-dir", "cache",
                       "--log-file", "logs/mount.log", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "mnt" / "hello.txt").read_text() == "hello"
    assert f"mounted {local_bucket.as_uri()} at {workdir}/mnt" in \
        (workdir / "logs" / "mount.log").read_text()
    assert not (workdir / "cache" / "avafs.log").exists()
