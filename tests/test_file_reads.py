"""`Client.read_files`: whole files in one request to the daemon, as reading them through the
mount gives them (clean files, pending writes, pending renames, errors), with real daemons."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest
from datasets import payload

from avafs.client import Client

KiB = 1024


def object_gets(server, bucket: str) -> int:
    return sum(1 for line in server.requests() if line.startswith(f"GET /{bucket}/")
               and "list-type" not in line and "prefix=" not in line)


def test_batch_equals_reads_through_the_mount(s3_server, bucket, mount):
    files = {f"train/{i:03d}.bin": payload(i, 16 * KiB + i) for i in range(100)}
    files["train/empty"] = b""
    files["deep/a/b/c.bin"] = payload(500, 5 * 2**20 + 1)
    client = s3_server.client()
    for key, data in files.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint, "--block-size", "1MiB")

    reader = Client(mnt)
    assert reader.read_files([mnt / key for key in files]) == list(files.values())
    gets = object_gets(s3_server, bucket)
    assert reader.read_files(["train/007.bin", mnt / "deep/a/b/c.bin"]) == \
        [files["train/007.bin"], files["deep/a/b/c.bin"]]
    assert object_gets(s3_server, bucket) == gets, "a second batch is served from the cache"
    assert (mnt / "train/042.bin").read_bytes() == files["train/042.bin"]
    assert reader.read_files([]) == []


def test_pending_writes_and_renames_are_read_as_the_mount_shows_them(s3_server, bucket, mount):
    s3_server.client().put_object(Bucket=bucket, Key="old.bin", Body=payload(1, 40 * KiB))
    mnt = mount(f"s3://{bucket}", "--endpoint-url", s3_server.endpoint,
                "--writeback-delay", "3600")
    written = payload(2, 70 * KiB)
    (mnt / "new.bin").write_bytes(written)
    os.rename(mnt / "old.bin", mnt / "moved.bin")

    assert Client(mnt).read_files([mnt / "new.bin", mnt / "moved.bin"]) == \
        [written, payload(1, 40 * KiB)]
    with pytest.raises(FileNotFoundError):
        Client(mnt).read_files([mnt / "old.bin"])


def test_errors_are_the_ones_open_would_raise(local_bucket, mount):
    (local_bucket / "dir").mkdir()
    (local_bucket / "dir" / "f").write_bytes(b"x")
    mnt = mount(local_bucket.as_uri())
    reader = Client(mnt)
    with pytest.raises(FileNotFoundError) as missing:
        reader.read_files([mnt / "dir" / "f", mnt / "dir" / "nope"])
    assert missing.value.filename == str(mnt / "dir" / "nope")
    with pytest.raises(IsADirectoryError):
        reader.read_files([mnt / "dir"])
    assert reader.read_files([mnt / "dir" / "f"]) == [b"x"], "the connection survives errors"


def test_files_too_large_for_one_answer_are_read_through_the_mount(local_bucket, mount):
    big = os.urandom(64 * 2**20 + 1)
    (local_bucket / "big").write_bytes(big)
    mnt = mount(local_bucket.as_uri())
    assert Client(mnt).read_files([mnt / "big"]) == [big]


def _read_in_child(pickled: bytes, path: str, queue) -> None:
    queue.put(pickle.loads(pickled).read_files([path])[0])


def test_a_client_used_before_a_fork_works_in_the_child(local_bucket, mount):
    (local_bucket / "f").write_bytes(b"sample")
    mnt = mount(local_bucket.as_uri())
    reader = Client(mnt)
    assert reader.read_files([mnt / "f"]) == [b"sample"]
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child,
                            args=(pickle.dumps(reader), str(mnt / "f"), queue))
    child.start()
    assert queue.get(timeout=30) == b"sample"
    child.join(timeout=30)
    assert child.exitcode == 0
    assert reader.read_files([mnt / "f"]) == [b"sample"]
