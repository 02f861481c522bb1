"""Upload while writing: large files written front to back reach the store part by part while
still open, and anything that breaks that order falls back to a whole upload after close."""

from __future__ import annotations

import contextlib
import os
import stat
import time

import pytest
from sample_data import payload, sha256
from support import store_bytes, unmount

from avafs.client import Client
from avafs.host.processes import wait_for_exit
from avafs.writeback.journal import Journal
from avafs.writeback.pending import DATA, Pending
from avafs.writeback.streaming import part_size

MiB = 2**20


def uploads_in_progress(server, bucket: str) -> list[dict]:
    return server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def wait_for_parts(server, bucket: str, key: str, count: int, timeout: float = 60) -> None:
    """Until the store holds `count` parts of the (single) upload of `key` in progress."""
    client = server.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for upload in uploads_in_progress(server, bucket):
            if upload["Key"] == key:
                parts = client.list_parts(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
                if len(parts.get("Parts", [])) >= count:
                    return
        time.sleep(0.1)
    raise AssertionError(f"{count} parts of {key} never reached the store")


def wait_until_no_uploads(server, bucket: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while uploads_in_progress(server, bucket):
        assert time.monotonic() < deadline, uploads_in_progress(server, bucket)
        time.sleep(0.1)


def write(file, data: bytes) -> None:
    for offset in range(0, len(data), MiB):
        file.write(data[offset:offset + MiB])
    file.flush()


def kill_daemon(mnt, open_file=None) -> None:
    """`kill -9` the mount's daemon, then unmount what it left; a file it had open is closed
    after, which can no longer reach the daemon."""
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    wait_for_exit(pid, 30)
    if open_file is not None:
        with contextlib.suppress(OSError):
            open_file.close()
    unmount(mnt)


def test_part_sizes_reach_past_the_largest_object_in_ten_thousand_parts():
    assert part_size(1) == part_size(1000) == 8 * MiB
    assert sum(part_size(number) for number in range(1, 10_001)) > 5 * 2**40
    assert max(part_size(number) for number in range(1, 10_001)) <= 5 * 2**30


def test_journal_keeps_unfinished_uploads_apart_from_pending_states(tmp_path):
    journal = Journal(tmp_path / "journal")
    journal.save([Pending("bucket", "a/b.pt", DATA, 1, file="f1")])
    for key, at in (("a/b.pt", 1.5), ("c.pt", 2.5), ("d.pt", 3.5)):
        journal.upload_intended("bucket", key, at, {"older-1", "older-2"} if at > 3 else set())
    journal.upload_started("bucket", "a/b.pt", "upload-1", 1.5)
    journal.upload_started("bucket", "c.pt", "upload-2", 2.5)
    journal.upload_ended("bucket", "c.pt", "upload-2")
    journal.close()
    reopened = Journal(tmp_path / "journal")
    try:
        assert [entry.key for entry in reopened.load()] == ["a/b.pt"]
        assert reopened.load_uploads() == [("bucket", "a/b.pt", "upload-1")]
        assert reopened.load_intents() == [("bucket", "d.pt", 3.5, {"older-1", "older-2"})]
    finally:
        reopened.close()


def test_parts_reach_the_store_while_the_file_is_still_open(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    data = payload(3, 90 * MiB + 123)
    with open(mnt / "ckpt.pt", "wb") as file:
        write(file, data[:80 * MiB])
        wait_for_parts(s3_server, bucket, "ckpt.pt", 10)
        write(file, data[80 * MiB:])
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "ckpt.pt")) == sha256(data)
    head = s3_server.client().head_object(Bucket=bucket, Key="ckpt.pt")
    assert head["ETag"].strip('"').endswith("-12")  # 11 parts of 8 MiB and the rest
    assert head["ContentLength"] == len(data)
    assert uploads_in_progress(s3_server, bucket) == []
    assert sha256((mnt / "ckpt.pt").read_bytes()) == sha256(data)


def copies_made(mnt) -> int:
    return Client(mnt).status()["store_requests"].get("copy", 0)


def test_a_streamed_file_goes_up_with_its_mode_and_no_copy(s3_server, bucket, s3_mount):
    """Its upload starts with the file's mode; with no final mtime known while it is written,
    the object shows its upload time, and no copy onto itself sends every byte again."""
    mnt = s3_mount()
    data = payload(8, 70 * MiB)
    started = time.time()
    with os.fdopen(os.open(mnt / "ckpt.pt", os.O_CREAT | os.O_WRONLY, 0o640), "wb") as file:
        write(file, data)
    Client(mnt).flush()
    head = s3_server.client().head_object(Bucket=bucket, Key="ckpt.pt")
    assert head["Metadata"] == {"mode": str(stat.S_IFREG | 0o640)}
    assert head["ETag"].strip('"').endswith("-9")
    assert copies_made(mnt) == 0
    shown = os.stat(mnt / "ckpt.pt")
    assert stat.S_IMODE(shown.st_mode) == 0o640
    assert started - 2 <= shown.st_mtime <= time.time() + 2


def test_a_streamed_file_whose_mtime_is_set_before_close_gets_it_in_the_store(
        s3_server, bucket, s3_mount):
    mnt = s3_mount()
    with open(mnt / "ckpt.pt", "wb") as file:
        write(file, payload(9, 70 * MiB))
        os.utime(file.fileno(), (1_600_000_000.5, 1_600_000_000.5))
    Client(mnt).flush()
    head = s3_server.client().head_object(Bucket=bucket, Key="ckpt.pt")
    assert float(head["Metadata"]["mtime"]) == 1_600_000_000.5
    assert copies_made(mnt) == 1
    assert os.stat(mnt / "ckpt.pt").st_mtime == 1_600_000_000.5


def test_a_file_sent_in_parts_after_close_carries_its_mtime(s3_server, bucket, s3_mount):
    """Written out of order it does not stream; after its close its parts go up with the
    exact mtime and mode, and no copy follows."""
    mnt = s3_mount()
    data = payload(10, 66 * MiB)
    with open(mnt / "shuffled.bin", "wb") as file:
        file.seek(MiB)
        write(file, data[MiB:])
        file.seek(0)
        file.write(data[:MiB])
    written = os.stat(mnt / "shuffled.bin").st_mtime
    Client(mnt).flush()
    head = s3_server.client().head_object(Bucket=bucket, Key="shuffled.bin")
    assert float(head["Metadata"]["mtime"]) == pytest.approx(written, abs=1e-6)
    assert head["ETag"].strip('"').endswith("-9")
    assert copies_made(mnt) == 0
    assert sha256(store_bytes(s3_server, bucket, "shuffled.bin")) == sha256(data)


def test_a_write_below_the_streamed_parts_uploads_the_file_whole(s3_server, bucket, s3_mount):
    """A writer that goes back (a header written last, as zip writers do) must not leave the
    store with the first version of the bytes it rewrote."""
    mnt = s3_mount()
    data = bytearray(payload(4, 72 * MiB))
    with open(mnt / "model.zip", "wb") as file:
        write(file, bytes(data))
        wait_for_parts(s3_server, bucket, "model.zip", 8)
        file.seek(100)
        file.write(b"header written last")
        data[100:119] = b"header written last"
        file.seek(len(data))
        write(file, b"tail" * 1000)
        data += b"tail" * 1000
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "model.zip")) == sha256(bytes(data))
    wait_until_no_uploads(s3_server, bucket)


def test_truncate_below_the_streamed_parts_uploads_the_file_whole(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    data = payload(5, 80 * MiB)
    with open(mnt / "log.bin", "wb") as file:
        write(file, data)
        wait_for_parts(s3_server, bucket, "log.bin", 9)
        file.truncate(10 * MiB)
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "log.bin")) == sha256(data[:10 * MiB])
    wait_until_no_uploads(s3_server, bucket)


def test_renaming_a_file_being_streamed(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    data = payload(6, 75 * MiB)
    with open(mnt / "tmp.pt", "wb") as file:
        write(file, data[:70 * MiB])
        wait_for_parts(s3_server, bucket, "tmp.pt", 8)
        os.rename(mnt / "tmp.pt", mnt / "final.pt")
        write(file, data[70 * MiB:])
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "final.pt")) == sha256(data)
    assert "Contents" not in s3_server.client().list_objects_v2(Bucket=bucket, Prefix="tmp")
    wait_until_no_uploads(s3_server, bucket)


def test_store_failing_while_parts_go_up_loses_nothing(s3_server, bucket, s3_mount, proxy):
    mnt = s3_mount(endpoint=proxy.endpoint)
    data = payload(7, 80 * MiB)
    with open(mnt / "ckpt.pt", "wb") as file:
        write(file, data[:66 * MiB])
        proxy.mode = "503"
        write(file, data[66 * MiB:])
    time.sleep(3)
    proxy.mode = "pass"
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "ckpt.pt")) == sha256(data)


def test_daemon_killed_mid_stream_then_remount_uploads_the_fsynced_file(s3_server, bucket,
                                                                       s3_mount):
    mnt = s3_mount("--writeback-delay", "3600")
    data = payload(8, 70 * MiB)
    file = open(mnt / "ckpt.pt", "wb")  # noqa: SIM115 - left open: the daemon dies under it
    write(file, data)
    os.fsync(file.fileno())
    wait_for_parts(s3_server, bucket, "ckpt.pt", 8)
    kill_daemon(mnt, file)
    assert len(uploads_in_progress(s3_server, bucket)) == 1
    mnt = s3_mount("--writeback-delay", "3600", mountpoint=mnt)
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "ckpt.pt")) == sha256(data)
    wait_until_no_uploads(s3_server, bucket)  # the next mount aborted the one left unfinished


def test_a_large_file_uploaded_after_close_and_cut_by_a_kill_leaves_no_upload_open(
        s3_server, bucket, s3_mount, proxy):
    """A file written out of order does not stream; its upload after close goes in parts all
    the same, journaled, so the next mount aborts what a kill left in the store."""
    mnt = s3_mount(endpoint=proxy.endpoint)
    data = payload(9, 70 * MiB)
    with open(mnt / "shuffled.bin", "wb") as file:
        file.seek(69 * MiB)
        file.write(data[69 * MiB:])
        file.seek(0)
        write(file, data[:69 * MiB])
        proxy.mode = "slow"
    deadline = time.monotonic() + 60
    while not uploads_in_progress(s3_server, bucket):
        assert time.monotonic() < deadline, "the upload never began"
        time.sleep(0.1)
    time.sleep(0.5)  # the upload id reaches the journal right after the store gave it
    kill_daemon(mnt)
    proxy.mode = "pass"
    mnt = s3_mount(mountpoint=mnt)
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "shuffled.bin")) == sha256(data)
    wait_until_no_uploads(s3_server, bucket)


def test_a_kill_before_the_upload_id_is_journaled_leaves_no_upload_open(s3_server, bucket,
                                                                        s3_mount, proxy):
    """The store starts a file's multipart upload and its answer never comes back (the fault
    proxy holds it) when the daemon is killed: no journal knows the id. The intent journaled
    before the request lets the next mount find that upload by its key and abort it, and
    only it: an upload of the same key another writer began before is left alone."""
    others = s3_server.client().create_multipart_upload(Bucket=bucket, Key="ckpt.pt")
    mnt = s3_mount("--writeback-delay", "3600", endpoint=proxy.endpoint)
    proxy.mode = "hold-create"
    data = payload(10, 70 * MiB)
    file = open(mnt / "ckpt.pt", "wb")  # noqa: SIM115 - left open: the daemon dies under it
    write(file, data)
    os.fsync(file.fileno())
    deadline = time.monotonic() + 60
    while not (proxy.held and len(uploads_in_progress(s3_server, bucket)) == 2):
        assert time.monotonic() < deadline, "the store never started the upload"
        time.sleep(0.1)
    kill_daemon(mnt, file)
    proxy.mode = "pass"
    mnt = s3_mount("--writeback-delay", "3600", endpoint=proxy.endpoint, mountpoint=mnt)
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "ckpt.pt")) == sha256(data)
    deadline = time.monotonic() + 30
    while len(uploads_in_progress(s3_server, bucket)) > 1:
        assert time.monotonic() < deadline, uploads_in_progress(s3_server, bucket)
        time.sleep(0.1)
    [left] = uploads_in_progress(s3_server, bucket)
    assert left["UploadId"] == others["UploadId"], "another writer's upload is left alone"


def test_a_kill_during_a_large_copy_leaves_no_upload_open(s3_server, bucket, s3_mount, proxy):
    """Renaming a large file is a copy the store's client makes in parts of its own, whose
    upload id never reaches avafs. A kill during it (the proxy holds the answer to its
    CreateMultipartUpload) leaves the intent journaled around it, by which the next mount
    aborts that upload."""
    data = payload(11, 70 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="big.bin", Body=data)
    mnt = s3_mount(endpoint=proxy.endpoint)
    assert os.listdir(mnt) == ["big.bin"]
    proxy.mode = "hold-create"
    os.rename(mnt / "big.bin", mnt / "moved.bin")
    deadline = time.monotonic() + 60
    while not (proxy.held and uploads_in_progress(s3_server, bucket)):
        assert time.monotonic() < deadline, "the copy never started its upload"
        time.sleep(0.1)
    kill_daemon(mnt)
    proxy.mode = "pass"
    mnt = s3_mount(endpoint=proxy.endpoint, mountpoint=mnt)
    Client(mnt).flush()
    assert sha256(store_bytes(s3_server, bucket, "moved.bin")) == sha256(data)
    wait_until_no_uploads(s3_server, bucket)
