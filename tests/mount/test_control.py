"""Warmup, status, metrics, prefetch and evict through the real CLI, Client and daemon."""

from __future__ import annotations

import json
import os
import re
import stat
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sample_data import payload, sha256
from support import S3Server, run_avafs

from avafs.client import Client, NotAnAvafsMount

KiB = 1024


@pytest.fixture
def private_server(tmp_path, s3_env):
    """A server of this test's own, so the test may stop it."""
    server = S3Server(tmp_path / "private-s3.log")
    yield server
    if server.process.poll() is None:
        server.stop()


def object_gets(server) -> int:
    return sum(1 for line in server.requests() if line.startswith("GET /")
               and "list-type" not in line and "prefix=" not in line)


def test_warm_directory_and_manifest_then_read_with_server_stopped(private_server, mount,
                                                                   tmp_path):
    client = private_server.client()
    client.create_bucket(Bucket="data")
    files = {f"train/{i:03d}.bin": payload(i, 50 * KiB + i) for i in range(40)}
    files.update({f"val/{i:03d}.bin": payload(1000 + i, 3 * KiB) for i in range(10)})
    files["big/shard.bin"] = payload(7, 5 * 2**20 + 3)
    for key, data in files.items():
        client.put_object(Bucket="data", Key=key, Body=data)
    mnt = mount("s3://data", "--endpoint-url", private_server.endpoint, "--block-size", "1MiB")
    manifest = tmp_path / "val.jsonl"
    manifest.write_text("".join(
        json.dumps({"path": key, "label": n} if n % 2 else {"url": f"s3://data/{key}"}) + "\n"
        for n, key in enumerate(k for k in files if k.startswith("val/"))))

    result = run_avafs("warmup", str(mnt / "train"), str(mnt / "big"), "--manifest",
                       str(manifest), "--threads", "4")
    assert result.returncode == 0, result.stderr
    assert "warmup 1 done: 51 files" in result.stdout
    private_server.stop()
    for key, data in files.items():
        assert sha256((mnt / key).read_bytes()) == sha256(data), key


def test_warmup_skips_what_is_already_cached(s3_server, bucket, mount):
    client = s3_server.client()
    for i in range(6):
        client.put_object(Bucket=bucket, Key=f"d/{i}", Body=payload(i, 10 * KiB))
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint)
    (mnt / "d" / "0").read_bytes()
    (mnt / "d" / "1").read_bytes()
    state = Client(mnt).warmup([mnt / "d"])
    assert (state["files_done"], state["files_already_cached"]) == (4, 2)
    assert (state["bytes_done"], state["bytes_already_cached"]) == (40 * KiB, 20 * KiB)


def test_warmup_larger_than_cache_warns_and_stays_within_cap(local_bucket, mount, tmp_path):
    for i in range(30):
        (local_bucket / f"{i:02d}.bin").write_bytes(payload(i, 200 * KiB))
    mnt = mount(local_bucket.as_uri(), "--disk-cache", "2MiB", "--block-size", "256KiB")
    result = run_avafs("warmup", str(mnt))
    assert result.returncode == 0, result.stderr
    assert "larger than the disk tier" in result.stderr
    status = Client(mnt).status()
    disk = status["tiers"]["disk"]
    assert disk["used_bytes"] <= disk["capacity_bytes"] * disk["high_watermark"]
    job = status["warmups"][0]
    assert job["files_done"] + job["files_skipped_for_space"] == 30
    assert job["files_done"] == int(2 * 2**20 * 0.9 // (200 * KiB))
    assert status["evictions"]["disk"] == 0
    blocks = tmp_path / "cache" / "disk" / "blocks"
    on_disk = sum(p.stat().st_blocks * 512 for p in blocks.rglob("*") if p.is_file())
    assert on_disk <= 2 * 2**20


def test_warmup_failures_exit_non_zero_and_are_listed(local_bucket, mount, tmp_path):
    (local_bucket / "present.bin").write_bytes(b"x")
    mnt = mount(local_bucket.as_uri())
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "present.bin"}\n{"path": "absent.bin"}\n')
    result = run_avafs("warmup", "--manifest", str(manifest), "--mount", str(mnt))
    assert result.returncode == 1
    assert "absent.bin" in result.stderr and "1 failed" in result.stdout


def test_bad_manifest_line_is_named(local_bucket, mount, tmp_path):
    mnt = mount(local_bucket.as_uri())
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "a"}\n\n{"path": oops}\n')
    result = run_avafs("warmup", "--manifest", str(manifest), "--mount", str(mnt))
    assert result.returncode == 1
    assert f"{manifest}:3: not valid JSON" in result.stderr


def test_progress_lines_when_not_a_terminal(local_bucket, mount):
    for i in range(4):
        (local_bucket / f"{i}.bin").write_bytes(payload(i, 4 * 2**20))
    mnt = mount(local_bucket.as_uri(), "--inflight-memory", "4MiB")
    result = run_avafs("warmup", str(mnt), "--threads", "1")
    assert result.returncode == 0
    lines = result.stdout.strip().splitlines()
    assert lines[:-1], "no progress line"
    for line in lines[:-1]:
        assert line == "warmup 1: listing files and checking what is cached" or (
            line.startswith("warmup 1: running, ") and "/4 files, " in line
            and "/16.0 MiB, " in line), line
    assert lines[-1].startswith("warmup 1 done: 4 files (16.0 MiB) loaded")
    assert "\x1b[" not in result.stdout


def test_progress_of_one_large_file_moves_by_bytes(s3_server, bucket, s3_mount, proxy):
    """One file loaded over a slow link: the lines between the start and the end show a
    part of its bytes loaded, not 0 until the whole file is in."""
    s3_server.client().put_object(Bucket=bucket, Key="large.bin", Body=payload(3, 24 * 2**20))
    mnt = s3_mount("--block-size", "1MiB", endpoint=proxy.endpoint)
    proxy.rate = 4 * 2**20
    proxy.mode = "link"
    result = run_avafs("warmup", str(mnt), "--threads", "2")
    assert result.returncode == 0, result.stderr
    parts = [float(found.group(1)) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1}[found.group(2)]
             for line in result.stdout.splitlines()
             if (found := re.search(r"running, 0/1 files, ([\d.]+) (B|KiB|MiB)/24\.0 MiB", line))]
    assert parts, result.stdout
    assert any(0 < part < 24 for part in parts), result.stdout


def test_background_warmup_shows_in_status(local_bucket, mount):
    for i in range(3):
        (local_bucket / f"{i}.bin").write_bytes(payload(i, 100 * KiB))
    mnt = mount(local_bucket.as_uri())
    result = run_avafs("warmup", str(mnt), "--background")
    assert result.returncode == 0 and "started in the background" in result.stdout
    deadline = time.monotonic() + 30
    while (job := Client(mnt).status()["warmups"][0])["state"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert job["files_done"] == 3
    assert "warmup 1 done: 3/3 files" in run_avafs("status", str(mnt)).stdout


def test_status_json_counts_a_known_workload(s3_server, bucket, mount):
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="a.bin", Body=payload(1, 3 * 2**20))
    client.put_object(Bucket=bucket, Key="b.bin", Body=payload(2, 1000))
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--block-size", "1MiB",
                "--read-ahead", "0", "--ram-cache", "64MiB", "--disk-cache", "256MiB")
    (mnt / "a.bin").read_bytes()
    (mnt / "b.bin").read_bytes()
    fd = os.open(mnt / "a.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    result = run_avafs("status", str(mnt), "--json")
    status = json.loads(result.stdout)
    assert status["version"] == 1
    assert status["misses"] == 4
    assert status["store_requests"]["get"] == 4
    assert status["bytes_served"]["store"] == 3 * 2**20 + 1000
    # b.bin's lookup fetched it (its one GET, which told its attributes) to the disk tier,
    # where its read found it.
    assert status["hits"]["ram"] >= 1 and status["hits"]["disk"] == 1
    assert status["tiers"]["disk"]["files"] == 4
    assert status["tiers"]["ram"]["files"] == 3, "a.bin's blocks; b.bin, small, stays on disk"
    assert status["tiers"]["ram"]["used_bytes"] == 3 * 2**20
    assert status["tiers"]["ram"]["capacity_bytes"] == 64 * 2**20
    assert status["dirty"] == {"bytes": 0, "files": 0, "upload_queue": 0, "uploading": 0,
                               "set_aside": []}
    assert 0 < status["hit_ratio"] < 1
    assert status["sources"] == {"": f"s3://{bucket}"}


def test_metrics_endpoint_matches_the_workload(local_bucket, mount, tmp_path):
    from support import free_port

    port = free_port()
    (local_bucket / "m.bin").write_bytes(payload(9, 2 * 2**20 + 5))
    mnt = mount(local_bucket.as_uri(), "--metrics-addr", f"127.0.0.1:{port}",
                "--block-size", "1MiB")
    Client(mnt).warmup([mnt])
    (mnt / "m.bin").read_bytes()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    mount_labels = {"mount": str(mnt), "source_url": local_bucket.as_uri()}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert {name: labels.pop(name, None) for name in mount_labels} == mount_labels
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    assert samples[("avafs_cache_misses_total", ())] == 3
    assert samples[("avafs_store_requests_total", (("operation", "get"),))] == 3
    assert samples[("avafs_warmup_files_total", ())] == 1
    assert samples[("avafs_warmup_bytes_total", ())] == 2 * 2**20 + 5
    assert samples[("avafs_tier_files", (("tier", "disk"),))] == 3
    assert samples[("avafs_bytes_served_total", (("source", "disk"),))] == 2 * 2**20 + 5
    assert ("avafs_store_request_seconds_count", (("operation", "get"),)) in samples
    assert samples[("avafs_dirty_bytes", ())] == 0


def test_prefetch_loads_before_the_read(s3_server, bucket, mount):
    client = s3_server.client()
    for i in range(5):
        client.put_object(Bucket=bucket, Key=f"p/{i}.bin", Body=payload(i, 20 * KiB))
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint)
    os.listdir(mnt / "p")
    avafs = Client.for_path(mnt / "p")
    assert avafs.prefetch([mnt / "p" / f"{i}.bin" for i in range(3)]) == 3
    deadline = time.monotonic() + 20
    while avafs.status()["prefetch"]["done"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    gets_before = object_gets(s3_server)
    for i in range(3):
        assert (mnt / "p" / f"{i}.bin").read_bytes() == payload(i, 20 * KiB)
    assert object_gets(s3_server) == gets_before
    assert avafs.status()["hits"]["ram"] >= 3


def test_evict_drops_clean_blocks(s3_server, bucket, mount):
    s3_server.client().put_object(Bucket=bucket, Key="e.bin", Body=payload(3, 10 * KiB))
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint)
    Client(mnt).warmup([mnt / "e.bin"], tier="ram")
    result = run_avafs("evict", str(mnt / "e.bin"))
    assert result.returncode == 0 and "evicted 2 cached blocks of 1 files" in result.stdout
    status = Client(mnt).status()
    assert status["tiers"]["disk"]["files"] == 0 and status["tiers"]["ram"]["files"] == 0


def test_client_outside_a_mount_and_socket_permissions(local_bucket, mount, tmp_path):
    with pytest.raises(NotAnAvafsMount, match="not inside an avafs mount"):
        Client.for_path(tmp_path)
    mnt = mount(local_bucket.as_uri())
    socket_path = Path(os.getxattr(mnt, "user.avafs.control").decode())
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
    assert Client.for_path(mnt).mountpoint == mnt
