"""Snapshots through real mounts (README, "Snapshots"): made from a mount's directory or a
bucket URL, mounted read-only with --snapshot, read back byte-exact after the bucket changed,
on a moto and a SeaweedFS bucket with versions, a moto bucket without, and on a file://
bucket; warmed with
`avafs warmup --snapshot`."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import pytest
from support import run_avafs, unmount

BLOCK = 2**20


def payload(seed: int, size: int) -> bytes:
    return bytes((seed * 7 + index) % 251 for index in range(size))


def _versioned_bucket(s3_server) -> str:
    name = f"snap-{uuid.uuid4().hex[:12]}"
    client = s3_server.client()
    client.create_bucket(Bucket=name)
    client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def _tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def _log_lines(cache_dir: Path, text: str) -> list[str]:
    return [line for line in (cache_dir / "avafs.log").read_text().splitlines() if text in line]


def test_a_versioned_bucket_reads_the_snapshot_after_overwrites_and_deletes(
        s3_server, s3_env, mount, tmp_path):
    bucket = _versioned_bucket(s3_server)
    client = s3_server.client()
    recorded = {"train/a.bin": payload(1, 3 * BLOCK + 17), "train/b.bin": payload(2, 1000),
                "train/sub/c.bin": payload(3, 50_000), "notes.txt": b"notes"}
    for key, body in recorded.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    args = ("--endpoint-url", s3_server.endpoint, "--block-size", str(BLOCK))
    live = mount(f"s3://{bucket}", *args, "--writeback-delay", "0.2",
                 cache_dir=tmp_path / "live-cache")
    (live / "train" / "written.bin").write_bytes(b"written through the mount")
    recorded["train/written.bin"] = b"written through the mount"
    made = run_avafs("snapshot", "create", str(live / "train"), "monday")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("snapshot monday of train/: 4 files"), made.stdout
    assert "pinned by versions" in made.stdout
    assert ".avafs-snapshots" not in os.listdir(live)
    again = run_avafs("snapshot", "create", str(live), "monday")
    assert again.returncode == 1
    assert again.stderr.startswith("avafs: error: snapshot 'monday' exists already")
    assert len(again.stderr.splitlines()) == 1

    client.put_object(Bucket=bucket, Key="train/a.bin", Body=b"relabelled")
    client.delete_object(Bucket=bucket, Key="train/b.bin")
    client.put_object(Bucket=bucket, Key="train/new.bin", Body=b"added later")
    expected = {key.removeprefix("train/"): body for key, body in recorded.items()
                if key.startswith("train/")}
    for cache in ("snap-cache", "empty-cache"):
        snap = mount(f"s3://{bucket}", *args, "--snapshot", "monday",
                     mountpoint=tmp_path / "snap", cache_dir=tmp_path / cache)
        assert sorted(os.listdir(snap)) == ["train"]
        assert _tree(snap / "train") == expected
        with pytest.raises(OSError) as refused:
            (snap / "train" / "x").write_bytes(b"no")
        assert refused.value.errno == errno.EROFS
        status = run_avafs("status", str(snap), "--json")
        assert '"name": "monday"' in status.stdout
        unmount(snap)


def test_a_versioned_seaweedfs_bucket_reads_the_snapshot_after_an_overwrite_and_a_delete(
        seaweed_cluster, mount, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "seaweed")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "seaweed-secret")
    client = seaweed_cluster.client()
    client.create_bucket(Bucket="versioned")
    client.put_bucket_versioning(Bucket="versioned",
                                 VersioningConfiguration={"Status": "Enabled"})
    recorded = {"a.bin": payload(6, BLOCK + 5), "b.bin": payload(7, 4000)}
    for key, body in recorded.items():
        client.put_object(Bucket="versioned", Key=key, Body=body)
    made = run_avafs("snapshot", "create", "s3://versioned", "v1", "--endpoint-url",
                     seaweed_cluster.endpoint)
    assert made.returncode == 0, made.stderr
    assert "pinned by versions" in made.stdout
    client.put_object(Bucket="versioned", Key="a.bin", Body=b"overwritten")
    client.delete_object(Bucket="versioned", Key="b.bin")
    snap = mount("s3://versioned", "--endpoint-url", seaweed_cluster.endpoint, "--block-size",
                 str(BLOCK), "--snapshot", "v1", mountpoint=tmp_path / "snap",
                 cache_dir=tmp_path / "cache")
    assert _tree(snap) == recorded


def test_an_unversioned_bucket_serves_cached_blocks_then_fails_once_they_are_gone(
        s3_server, bucket, mount, tmp_path):
    client = s3_server.client()
    old = {"small.bin": payload(4, 10_000), "large.bin": payload(5, 3 * BLOCK)}
    for key, body in old.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    client.put_object(Bucket=bucket, Key="kept.bin", Body=b"unchanged")
    made = run_avafs("snapshot", "create", f"s3://{bucket}", "v1", "--endpoint-url",
                     s3_server.endpoint)
    assert made.returncode == 0, made.stderr
    assert "pinned by ETags" in made.stdout
    args = (f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--block-size", str(BLOCK),
            "--snapshot", "v1")
    cache = tmp_path / "cache"
    snap = mount(*args, mountpoint=tmp_path / "snap", cache_dir=cache)
    for key, body in old.items():
        assert (snap / key).read_bytes() == body
    unmount(snap)
    new = b"the new bytes " * 1000
    for key in old:
        client.put_object(Bucket=bucket, Key=key, Body=new)

    snap = mount(*args, mountpoint=tmp_path / "snap", cache_dir=cache)
    for key, body in old.items():
        assert (snap / key).read_bytes() == body, "served from the disk tier's blocks"
    evicted = run_avafs("evict", str(snap / "small.bin"), str(snap / "large.bin"))
    assert evicted.returncode == 0, evicted.stderr
    unmount(snap)  # the kernel's pages of the files go with the mount

    snap = mount(*args, mountpoint=tmp_path / "snap", cache_dir=cache)
    for key in old:
        with pytest.raises(OSError) as failed:
            (snap / key).read_bytes()
        assert failed.value.errno == errno.EIO
        lines = _log_lines(cache, f"{key} of snapshot 'v1'")
        assert len(lines) == 1, lines
        assert "not served" in lines[0] and "new bytes" not in lines[0]
    assert (snap / "kept.bin").read_bytes() == b"unchanged"


def test_file_bucket_snapshot_commands_and_errors(local_bucket, mount, tmp_path):
    (local_bucket / "d").mkdir()
    (local_bucket / "d" / "one").write_bytes(b"1")
    (local_bucket / "d" / "two").write_bytes(b"22")
    (local_bucket / "kept").write_bytes(b"kept")
    live = mount(local_bucket.as_uri(), "--writeback-delay", "0.1")
    assert run_avafs("snapshot", "create", str(live), "a").returncode == 0
    (live / "d" / "two").write_bytes(b"changed")
    (live / "d" / "three").write_bytes(b"333")
    (live / "d" / "one").unlink()
    assert run_avafs("snapshot", "create", str(live), "b").returncode == 0
    listed = run_avafs("snapshot", "list", local_bucket.as_uri())
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [["a", "3"],
                                                                            ["b", "3"]]
    difference = run_avafs("snapshot", "diff", str(live), "a", "b")
    assert difference.stdout.splitlines() == [
        "+ d/three (3 B)", "- d/one (1 B)", "~ d/two (2 B -> 7 B)",
        "1 added, 1 removed, 1 changed"]
    unknown = run_avafs("snapshot", "delete", str(live), "c")
    assert unknown.returncode == 1
    assert unknown.stderr == (f"avafs: error: no snapshot 'c' in {local_bucket.as_uri()}: its "
                              "snapshots are a, b\n")
    flag = run_avafs("snapshot", "list", str(live), "--endpoint-url", "http://127.0.0.1:9")
    assert flag.returncode == 1 and "is for a bucket URL" in flag.stderr
    (tmp_path / "nope").mkdir()
    refused = run_avafs("mount", local_bucket.as_uri(), str(tmp_path / "nope"), "--snapshot",
                        "nope", "--cache-dir", str(tmp_path / "nope-cache"))
    assert refused.returncode == 1
    assert refused.stderr == (f"avafs: error: no snapshot 'nope' in {local_bucket.as_uri()}: "
                              "its snapshots are a, b\n")
    snap = mount(local_bucket.as_uri(), "--snapshot", "a", mountpoint=tmp_path / "snap",
                 cache_dir=tmp_path / "snap-cache")
    assert sorted(os.listdir(snap / "d")) == ["one", "two"]
    assert (snap / "kept").read_bytes() == b"kept"
    for changed in ("one", "two"):  # no versions, no cached blocks: never the new bytes
        with pytest.raises(OSError) as failed:
            (snap / "d" / changed).read_bytes()
        assert failed.value.errno == errno.EIO
    assert run_avafs("snapshot", "delete", str(live), "b").returncode == 0
    assert [line.split()[0] for line in
            run_avafs("snapshot", "list", str(live)).stdout.splitlines()[1:]] == ["a"]


def test_warmup_of_a_snapshot_fills_the_recorded_versions(s3_server, bucket, mount, tmp_path):
    client = s3_server.client()
    old = {f"f{index}.bin": payload(index, 200_000) for index in range(4)}
    for key, body in old.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    url = f"s3://{bucket}"
    assert run_avafs("snapshot", "create", url, "v1", "--endpoint-url",
                     s3_server.endpoint).returncode == 0
    client.put_object(Bucket=bucket, Key="f0.bin", Body=b"after the snapshot")
    cache = tmp_path / "cache"
    live = mount(url, "--endpoint-url", s3_server.endpoint, "--read-only", cache_dir=cache)
    warmed = run_avafs("warmup", "--snapshot", "v1", "--mount", str(live))
    assert warmed.returncode == 1, "f0.bin changed before the warmup: its version is gone"
    assert "f0.bin" in warmed.stderr
    assert "3 files" in warmed.stdout or "3/4" in warmed.stdout, warmed.stdout
    for key in ("f1.bin", "f2.bin", "f3.bin"):
        client.put_object(Bucket=bucket, Key=key, Body=b"changed after the warmup")
    unmount(live)
    snap = mount(url, "--endpoint-url", s3_server.endpoint, "--snapshot", "v1",
                 mountpoint=live, cache_dir=cache)
    for key in ("f1.bin", "f2.bin", "f3.bin"):
        assert (snap / key).read_bytes() == old[key]
