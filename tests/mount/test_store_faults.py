"""A store that hangs, refuses, resets, crawls or fails, and one that refuses a key for good,
under a real mount: lookups and stats never wait for it long, nothing written is lost, and
what the store refuses is set aside and reported without blocking anything else.

"Never long" is checked as liveness, not speed: each operation must end within LIVENESS
seconds, where the code before request limits waited many minutes for a hung store."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sample_data import payload
from support import free_port, run_avafs

from avafs.client import Client
from avafs.config.options import MOUNT_OPTIONS

T = TypeVar("T")
LIVENESS = 60.0
STORE_TIMEOUT = 2.0
FAULT_ARGS = ("--metadata-ttl", "1", "--store-timeout", f"{STORE_TIMEOUT:g}")
"""Listings trusted for a second (so lookups soon go to the store) and a 2 s request limit."""
SLACK = 2.0
"""Seconds of thread scheduling on a loaded machine allowed past a documented bound."""
MIN_RATE = next(spec.default for spec in MOUNT_OPTIONS if spec.name == "store_min_rate")
READ_BOUND = 3 * STORE_TIMEOUT + 2 * 2**20 / MIN_RATE + SLACK
"""The README's bound on a first read of up to 1 MiB from a store that does not answer or never
finishes an answer: one HEAD of the file's attributes (--store-timeout) and two GET tries of
--store-timeout + 1 MiB at --store-min-rate (its default)."""
FAILED_READ_MEMORY = 1.0
"""Seconds a failed read is answered with its error without asking the store again."""
LOOKUP_BOUND = STORE_TIMEOUT + SLACK
LISTING_WAIT = 1.0
"""Seconds a listing of a directory listed before, or made by the mount, waits for the store."""


def bounded(operation: Callable[[], T], what: str) -> T:
    """The operation's result, failing the test if it does not end within LIVENESS seconds
    (it is left running in a daemon thread)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = operation()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIVENESS)
    if thread.is_alive():
        raise AssertionError(f"{what} still waits for the store after {LIVENESS:.0f}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIVENESS
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {LIVENESS:.0f}s")
        time.sleep(0.2)


def store_bytes(server, bucket: str, key: str) -> bytes:
    return server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def store_keys(server, bucket: str) -> set[str]:
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {entry["Key"] for page in pages for entry in page.get("Contents", ())}


def unreachable(mnt) -> bool:
    return not Client(mnt).status()["stores"][""]["reachable"]


@pytest.mark.parametrize("mode", ["hang", "refuse", "reset", "slow", "503"])
def test_lookups_reads_and_writes_go_on_under_store_faults(s3_server, bucket, s3_mount, proxy,
                                                           mode):
    """Listed directories stay listable and their files statable from the cached listing,
    cached data stays readable, new files and directories are written locally; when the store
    answers again everything written reaches it. A cold file gives its bytes or EIO, never
    wrong bytes."""
    client = s3_server.client()
    originals = {f"d/f{number}.bin": payload(number, 20_000) for number in range(3)}
    for key, data in {**originals, "d/cold.bin": payload(9, 50_000)}.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
    proxy.rate = 256 * 1024
    mnt = s3_mount(*FAULT_ARGS, endpoint=proxy.endpoint)
    assert sorted(os.listdir(mnt / "d")) == ["cold.bin", "f0.bin", "f1.bin", "f2.bin"]
    assert (mnt / "d/f0.bin").read_bytes() == originals["d/f0.bin"]
    proxy.mode = mode
    time.sleep(1.5)  # past the metadata TTL: lookups go to the store again
    written = {f"d/new{number}.bin": payload(20 + number, 30_000) for number in range(3)}

    def use_the_mount() -> None:
        for key, data in originals.items():
            assert os.stat(mnt / key).st_size == len(data)
        assert "f1.bin" in os.listdir(mnt / "d")
        assert (mnt / "d/f0.bin").read_bytes() == originals["d/f0.bin"]
        for key, data in written.items():
            (mnt / key).write_bytes(data)
        (mnt / "d/sub").mkdir()
        (mnt / "d/sub/inner.txt").write_bytes(b"inner")

    bounded(use_the_mount, f"using the mount under a {mode} store")
    try:
        cold = bounded((mnt / "d/cold.bin").read_bytes, f"a cold read under a {mode} store")
        assert cold == payload(9, 50_000)
    except OSError as error:
        assert error.errno == errno.EIO
    proxy.mode = "pass"
    bounded(Client(mnt).flush, "flush once the store is back")
    for key, data in written.items():
        assert store_bytes(s3_server, bucket, key) == data
    assert store_bytes(s3_server, bucket, "d/sub/inner.txt") == b"inner"
    time.sleep(FAILED_READ_MEMORY)  # a cold read that failed above is answered so until then
    assert (mnt / "d/cold.bin").read_bytes() == payload(9, 50_000)


def timed(operation: Callable[[], T], what: str) -> tuple[T | OSError, float]:
    """The operation's result, or the OSError it raised, and the seconds it took."""
    started = time.monotonic()
    try:
        result: T | OSError = bounded(operation, what)
    except OSError as error:
        result = error
    return result, time.monotonic() - started


def test_a_read_from_a_trickling_store_fails_within_its_bound(s3_server, bucket, s3_mount,
                                                              proxy):
    """A store that sends a few bytes of the body a second never trips a socket timeout: the
    read's whole-request deadline ends each try, and the read fails with EIO in time."""
    data = payload(4, 200_000)
    s3_server.client().put_object(Bucket=bucket, Key="slow.bin", Body=data)
    mnt = s3_mount(*FAULT_ARGS, endpoint=proxy.endpoint)
    assert os.listdir(mnt) == ["slow.bin"]
    proxy.mode = "trickle"
    failed, seconds = timed((mnt / "slow.bin").read_bytes, "a read from a trickling store")
    assert isinstance(failed, OSError) and failed.errno == errno.EIO
    assert seconds < READ_BOUND
    assert any("slow.bin" in error["message"] and "in time" in error["message"]
               for error in Client(mnt).status()["recent_errors"])
    proxy.mode = "pass"
    time.sleep(FAILED_READ_MEMORY)
    assert (mnt / "slow.bin").read_bytes() == data


def test_an_uncached_read_from_a_hung_store_fails_within_its_bound(s3_server, bucket, s3_mount,
                                                                   proxy):
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="d/warm.bin", Body=b"warm")
    client.put_object(Bucket=bucket, Key="d/cold.bin", Body=payload(5, 50_000))
    mnt = s3_mount(*FAULT_ARGS, endpoint=proxy.endpoint)
    assert sorted(os.listdir(mnt / "d")) == ["cold.bin", "warm.bin"]
    proxy.mode = "hang"
    failed, seconds = timed((mnt / "d/cold.bin").read_bytes, "a cold read from a hung store")
    assert isinstance(failed, OSError) and failed.errno == errno.EIO
    assert seconds < READ_BOUND
    time.sleep(1.5)  # past the metadata TTL
    found, seconds = timed(lambda: os.stat(mnt / "d/warm.bin"), "a stat under a hung store")
    assert not isinstance(found, OSError) and found.st_size == 4
    assert seconds < LOOKUP_BOUND
    proxy.mode = "pass"
    time.sleep(FAILED_READ_MEMORY)
    assert (mnt / "d/cold.bin").read_bytes() == payload(5, 50_000)


def test_reads_waiting_on_a_hung_store_hold_up_no_other_request(s3_server, bucket, s3_mount,
                                                                 proxy):
    """The daemon takes every request in one loop and runs its handler there until the
    handler waits: reads waiting on a hung store go on aside, and a cached file, its
    directory and a new file are served meanwhile, all before any of those reads ends."""
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="d/warm.bin", Body=b"warm")
    cold_keys = [f"d/cold{number}.bin" for number in range(4)]
    for number, key in enumerate(cold_keys):
        client.put_object(Bucket=bucket, Key=key, Body=payload(number, 50_000))
    mnt = s3_mount("--metadata-ttl", "600", "--store-timeout", f"{STORE_TIMEOUT:g}",
                   endpoint=proxy.endpoint)
    assert sorted(os.listdir(mnt / "d")) == sorted(key[2:] for key in [*cold_keys, "d/warm.bin"])
    assert (mnt / "d/warm.bin").read_bytes() == b"warm"
    proxy.mode = "hang"
    ended: dict[str, tuple[object, float]] = {}

    def read_cold(key: str) -> None:
        try:
            outcome: object = (mnt / key).read_bytes()
        except OSError as error:
            outcome = error
        ended[key] = outcome, time.monotonic()

    readers = [threading.Thread(target=read_cold, args=(key,), daemon=True) for key in cold_keys]
    for reader in readers:
        reader.start()
    time.sleep(0.5)  # every cold read is waiting on the store by now
    assert (mnt / "d/warm.bin").read_bytes() == b"warm"
    assert "warm.bin" in os.listdir(mnt / "d")
    (mnt / "d/new.txt").write_bytes(b"new")
    assert (mnt / "d/new.txt").read_bytes() == b"new"
    served = time.monotonic()
    for reader in readers:
        reader.join(LIVENESS)
    assert sorted(ended) == cold_keys
    assert all(isinstance(outcome, OSError) and outcome.errno == errno.EIO
               for outcome, _ in ended.values())
    assert served < min(when for _, when in ended.values())


def test_uploads_to_a_hung_store_time_out_and_are_retried(s3_server, bucket, s3_mount, proxy):
    mnt = s3_mount(*FAULT_ARGS, endpoint=proxy.endpoint)
    assert os.listdir(mnt) == []
    proxy.mode = "hang"
    data = payload(3, 200_000)
    (mnt / "ckpt.bin").write_bytes(data)
    eventually(lambda: any("ckpt.bin" in error["message"] and "did not answer" in error["message"]
                           for error in Client(mnt).status()["recent_errors"]),
               "a failed upload attempt against the hung store")
    assert unreachable(mnt)
    assert "UNREACHABLE" in run_avafs("status", str(mnt)).stdout
    proxy.mode = "pass"
    bounded(Client(mnt).flush, "flush once the store is back")
    assert store_bytes(s3_server, bucket, "ckpt.bin") == data
    assert not unreachable(mnt)


def test_an_upload_the_store_refuses_is_set_aside_and_blocks_nothing(s3_server, bucket,
                                                                      s3_mount, tmp_path):
    """moto answers 404 to any request for a key holding a newline: a permanent refusal."""
    port = free_port()
    mnt = s3_mount("--metrics-addr", f"127.0.0.1:{port}")
    bad = "bad\nname.txt"
    (mnt / bad).write_bytes(b"kept locally")
    (mnt / "good.txt").write_bytes(b"uploaded")
    flushed = run_avafs("flush", str(mnt))
    assert flushed.returncode == 1
    assert "bad\\nname.txt" in flushed.stderr and "404" in flushed.stderr
    assert store_bytes(s3_server, bucket, "good.txt") == b"uploaded"
    status = json.loads(run_avafs("status", "--json", str(mnt)).stdout)
    [refused] = status["dirty"]["set_aside"]
    assert refused["key"] == bad and "404" in refused["error"]
    assert "not found at" not in refused["error"]  # not the missing-bucket message
    assert "set aside" in run_avafs("status", str(mnt)).stdout
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as answer:
        samples = {sample.name: sample.value for family in
                   text_string_to_metric_families(answer.read().decode())
                   for sample in family.samples}
    assert samples["avafs_uploads_set_aside"] == 1.0
    log = (tmp_path / "cache" / "avafs.log").read_text()
    assert "bad\\nname.txt" in log
    assert not any(line.startswith("name.txt") for line in log.splitlines())
    assert (mnt / bad).read_bytes() == b"kept locally"

    umounted = run_avafs("umount", str(mnt))
    assert umounted.returncode == 0 and "bad\\nname.txt" in umounted.stderr
    mnt = s3_mount(mountpoint=mnt)
    assert (mnt / bad).read_bytes() == b"kept locally"
    (mnt / bad).unlink()
    assert run_avafs("flush", str(mnt)).returncode == 0
    assert store_keys(s3_server, bucket) == {"good.txt"}


def test_deleting_a_file_stops_its_running_upload(s3_server, bucket, s3_mount, proxy):
    """A 4 GiB sparse file through a throttled link: its upload would take minutes; deleting
    the file ends it, leaves no object and no unfinished multipart upload in the bucket."""
    proxy.mode = "slow"
    proxy.rate = 4 * 2**20
    mnt = s3_mount(endpoint=proxy.endpoint)
    with open(mnt / "sparse.bin", "wb") as file:
        file.seek(4 * 2**30)
        file.write(b"x")
    eventually(lambda: Client(mnt).status()["dirty"]["uploading"] == 1, "the upload to start")
    eventually(lambda: proxy.sent_upstream > 16 * 2**20, "parts to be on their way")
    os.unlink(mnt / "sparse.bin")
    bounded(Client(mnt).flush, "flush after the delete")
    client = s3_server.client()
    eventually(lambda: not client.list_multipart_uploads(Bucket=bucket).get("Uploads"),
               "the multipart upload to be aborted")
    assert proxy.sent_upstream < 2**30
    assert "sparse.bin" not in store_keys(s3_server, bucket)


def test_writes_go_on_while_the_store_is_unreachable(s3_server, bucket, s3_mount, proxy,
                                                     tmp_path):
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="remote/old.bin", Body=b"remote data")
    client.put_object(Bucket=bucket, Key="elsewhere/existing.txt", Body=b"existing")
    mnt = s3_mount("--metadata-ttl", "1", endpoint=proxy.endpoint)
    assert sorted(os.listdir(mnt)) == ["elsewhere", "remote"]
    assert os.listdir(mnt / "remote") == ["old.bin"]
    proxy.mode = "refuse"
    time.sleep(1.5)  # past the TTL: the root's listing is stale, elsewhere/ never listed

    def write_offline() -> None:
        (mnt / "ckpt").mkdir()
        (mnt / "ckpt/step1.pt").write_bytes(payload(1, 100_000))
        (mnt / "elsewhere/new.txt").write_bytes(b"new")

    bounded(write_offline, "writing while the store refuses connections")
    assert os.listdir(mnt / "ckpt") == ["step1.pt"]
    with pytest.raises(OSError) as appended:
        open(mnt / "elsewhere/log.txt", "a").close()
    assert appended.value.errno == errno.EIO
    with pytest.raises(OSError) as read:
        (mnt / "remote/old.bin").read_bytes()
    assert read.value.errno == errno.EIO
    with pytest.raises(OSError) as append:
        open(mnt / "remote/old.bin", "ab").close()
    assert append.value.errno == errno.EIO
    assert unreachable(mnt)
    log = (tmp_path / "cache" / "avafs.log").read_text()
    assert f"cannot reach S3 endpoint {proxy.endpoint}" in log
    assert (mnt / "ckpt/step1.pt").read_bytes() == payload(1, 100_000)

    proxy.mode = "pass"
    bounded(Client(mnt).flush, "flush once the store is back")
    assert store_bytes(s3_server, bucket, "ckpt/step1.pt") == payload(1, 100_000)
    assert store_bytes(s3_server, bucket, "elsewhere/new.txt") == b"new"
    time.sleep(1.5)
    assert sorted(os.listdir(mnt / "elsewhere")) == ["existing.txt", "new.txt"]
    assert (mnt / "remote/old.bin").read_bytes() == b"remote data"


def test_a_new_directory_lists_every_entry_promptly_while_listings_are_slow(s3_server, bucket,
                                                                             s3_mount, proxy):
    """A directory the mount made, its files written and uploaded meanwhile, while every LIST
    answer takes 3 s: listing it waits for the store no longer than the limit (a second per
    directory) and shows every file, pending or uploaded."""
    mnt = s3_mount(*FAULT_ARGS, endpoint=proxy.endpoint)
    assert os.listdir(mnt) == []
    proxy.latency, proxy.mode = 3.0, "slow-list"
    (mnt / "new").mkdir()
    names: set[str] = set()
    for round_number in range(4):
        for number in range(100):
            name = f"r{round_number}-f{number}.txt"
            (mnt / "new" / name).write_bytes(name.encode())
            names.add(name)
        found, seconds = timed(lambda: os.listdir(mnt / "new"), "listing the new directory")
        assert not isinstance(found, OSError), found
        assert sorted(names - set(found)) == [] and len(found) == len(names)
        assert seconds < LISTING_WAIT + SLACK
        time.sleep(0.5)
    bounded(Client(mnt).flush, "flush")
    assert sorted(os.listdir(mnt / "new")) == sorted(names)
    assert len(store_keys(s3_server, bucket)) == len(names) + 1
