"""`Client.read_files` and `Client.list_files`: whole files and recursive listings in one request
to the daemon, as reading them through the mount gives them (clean files, pending writes,
pending renames, errors; warm files read in place from the disk tier, and remembered by readers
and by the daemon's snapshot for readers to come), with real daemons."""

from __future__ import annotations

import marshal
import mmap
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sample_data import payload
from support import object_gets, unmount

from avafs.client import AvafsError, Client
from avafs.config.cache_dir import LOCATIONS_FILE

KiB = 1024
MiB = 1024 * KiB


def wait_for_disk_tier(reader: Client, paths: list) -> None:
    """Fetched blocks reach the disk tier after their readers have them; wait until the daemon
    would answer every path in place (its blocks written and known good), without keeping the
    answers. The tier's file count is not enough: it counts a block from the start of its write."""
    relatives = [reader.relative(path) for path in paths]
    deadline = time.monotonic() + 30
    while len(reader._read_request(relatives, in_place=True)[0]["files"]) < len(paths):
        assert time.monotonic() < deadline, "blocks never reached the disk tier"
        time.sleep(0.05)


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


def test_warm_files_are_read_in_place_and_a_block_evicted_meanwhile_is_asked_for_again(
        local_bucket, mount, tmp_path):
    files = {f"s/{i:02d}.bin": payload(i, 16 * KiB + i) for i in range(40)}
    for key, data in files.items():
        (local_bucket / key).parent.mkdir(exist_ok=True)
        (local_bucket / key).write_bytes(data)
    mnt = mount(local_bucket.as_uri())
    reader = Client(mnt)
    paths = [mnt / key for key in files]
    assert reader.read_files(paths) == list(files.values())
    wait_for_disk_tier(reader, paths)
    before = reader.status()["hits"]

    answer, answered = reader._read_request([reader.relative(path) for path in paths], True)
    after = reader.status()["hits"]
    assert sorted(answer["files"]) == sorted(str(index) for index in range(len(files)))
    assert after["disk"] - before["disk"] == len(files), "answered with the disk tier's files"
    assert answered == b"" and after["ram"] == before["ram"], "no bytes went through the daemon"
    assert reader.read_files(paths) == list(files.values())

    for block in (tmp_path / "cache" / "disk" / "blocks").rglob("*"):
        if block.is_file():
            block.unlink()
    assert reader.read_files(paths) == list(files.values())


def test_blocks_left_by_a_clean_unmount_are_read_in_place_from_the_remount_on(
        local_bucket, mount, tmp_path):
    """A clean unmount syncs the disk tier, so the remount's readers on this machine get the
    block files at once, with no bytes through the daemon to check them first."""
    files = {f"{index}.bin": payload(index, 20 * KiB) for index in range(5)}
    for name, data in files.items():
        (local_bucket / name).write_bytes(data)
    mnt = mount(local_bucket.as_uri())
    paths = [mnt / name for name in files]
    assert Client(mnt).read_files(paths) == list(files.values())
    wait_for_disk_tier(Client(mnt), paths)
    unmount(mnt)

    mnt = mount(local_bucket.as_uri(), mountpoint=mnt)
    reader = Client(mnt)
    answer, answered = reader._read_request([reader.relative(path) for path in paths], True)
    assert sorted(answer["files"]) == sorted(str(index) for index in range(len(files)))
    assert answered == b"", "bytes went through the daemon"
    assert reader.read_files(paths) == list(files.values())


def test_a_large_file_read_after_a_clean_remount_is_sent_from_the_disk_tiers_files(
        local_bucket, mount, tmp_path):
    """Its blocks are not copied into RAM: each READ is a range of a block file, which the
    kernel splices, or, across two blocks, read from both files. Sequential and random reads
    of any size give the file's bytes."""
    data = payload(3, 10 * MiB + 12345)
    (local_bucket / "big.bin").write_bytes(data)
    mnt = mount(local_bucket.as_uri())
    assert (mnt / "big.bin").read_bytes() == data
    unmount(mnt)  # its blocks' writes to the disk tier end before the daemon does

    mnt = mount(local_bucket.as_uri(), mountpoint=mnt)
    assert (mnt / "big.bin").read_bytes() == data
    fd = os.open(mnt / "big.bin", os.O_RDONLY | os.O_DIRECT)
    buffer = mmap.mmap(-1, 2 * MiB)
    try:
        for offset, size in [(0, 4096), (4 * MiB - 4096, 2 * MiB), (10 * MiB, 1 * MiB),
                             (3 * MiB + 8192, 65536), (8 * MiB - 8192, 16384)]:
            with memoryview(buffer)[:size] as view:
                got = os.preadv(fd, [view], offset)
            assert buffer[:got] == data[offset:offset + size], (offset, size)
    finally:
        os.close(fd)
        buffer.close()
    status = Client(mnt).status()
    assert status["tiers"]["ram"]["used_bytes"] == 0
    assert status["bytes_served"]["store"] == 0


def test_a_block_file_cut_short_under_a_remount_is_fetched_again_not_sent_short(
        local_bucket, mount, tmp_path):
    data = payload(4, 10 * MiB)
    (local_bucket / "big.bin").write_bytes(data)
    mnt = mount(local_bucket.as_uri())
    assert (mnt / "big.bin").read_bytes() == data
    unmount(mnt)
    blocks = [path for path in (tmp_path / "cache" / "disk" / "blocks").rglob("*")
              if path.is_file()]
    [middle] = [path for path in blocks if path.read_bytes() == data[4 * MiB:8 * MiB]]
    os.truncate(middle, 1 * MiB)

    mnt = mount(local_bucket.as_uri(), mountpoint=mnt)
    assert (mnt / "big.bin").read_bytes() == data
    assert Client(mnt).status()["bytes_served"]["store"] >= 4 * MiB


def test_blocks_left_by_a_mount_that_crashed_are_checked_before_anyone_reads_them_in_place(
        local_bucket, mount, tmp_path):
    data = payload(7, 20 * KiB)
    (local_bucket / "f.bin").write_bytes(data)
    mnt = mount(local_bucket.as_uri())
    assert Client(mnt).read_files([mnt / "f.bin"]) == [data]
    wait_for_disk_tier(Client(mnt), [mnt / "f.bin"])
    unmount(mnt)
    (tmp_path / "cache" / "disk" / "synced").unlink()  # as a crash leaves the tier: unsynced
    [block] = [path for path in (tmp_path / "cache" / "disk" / "blocks").rglob("*")
               if path.is_file()]
    block.write_bytes(bytes(len(data)))  # torn: the right size, the wrong bytes

    mnt = mount(local_bucket.as_uri(), mountpoint=mnt)
    reader = Client(mnt)
    assert reader.read_files([mnt / "f.bin"]) == [data]
    assert reader.read_files([mnt / "f.bin"]) == [data]


def test_a_cache_dir_this_process_cannot_open_turns_in_place_reads_off(local_bucket, mount):
    (local_bucket / "f").write_bytes(b"sample")
    mnt = mount(local_bucket.as_uri())
    reader = Client(mnt)
    assert reader.read_files([mnt / "f"]) == [b"sample"]
    wait_for_disk_tier(reader, [mnt / "f"])
    # What another mount namespace sees: the socket, but not the cache dir behind it.
    reader._cache_dir = str(local_bucket / "f")
    assert reader.read_files([mnt / "f"]) == [b"sample"]
    assert not reader._in_place
    assert reader.read_files([mnt / "f"]) == [b"sample"]


def test_list_files_is_a_recursive_listing_as_the_mount_shows_it(local_bucket, mount):
    for key in ("a/1", "a/b/2", "a/b/c/3", "top", "a/gone"):
        (local_bucket / key).parent.mkdir(parents=True, exist_ok=True)
        (local_bucket / key).write_bytes(b"x")
    (local_bucket / "a" / "empty").mkdir()
    mnt = mount(local_bucket.as_uri(), "--writeback-delay", "3600")
    (mnt / "a" / "b" / "new").write_bytes(b"not uploaded yet")
    (mnt / "a" / "gone").unlink()

    walked = sorted(os.path.join(folder, name) for folder, _, names in os.walk(mnt / "a")
                    for name in names)
    reader = Client(mnt)
    assert sorted(reader.list_files(mnt / "a")) == walked
    assert sorted(reader.list_files(mnt)) == sorted(walked + [str(mnt / "top")])
    with pytest.raises(AvafsError, match="cannot list nope"):
        reader.list_files(mnt / "nope")
    with pytest.raises(AvafsError, match="NotADirectoryError"):
        reader.list_files(mnt / "top")


def test_in_place_reads_stay_exact_while_the_disk_tier_evicts_under_them(local_bucket, mount):
    files = {f"e/{i:03d}.bin": payload(i, 16 * KiB + i) for i in range(300)}
    for key, data in files.items():
        (local_bucket / key).parent.mkdir(exist_ok=True)
        (local_bucket / key).write_bytes(data)
    # Room for about 40 of the 300 files in each tier: every pass evicts what the last read.
    mnt = mount(local_bucket.as_uri(), "--disk-cache-files", "40", "--ram-cache-files", "40")
    readers = [Client(mnt) for _ in range(4)]
    keys = list(files)
    failures: list[str] = []

    def read(reader: Client, offset: int) -> None:
        for round_ in range(6):
            order = keys[offset + round_:] + keys[:offset + round_]
            for start in range(0, len(order), 32):
                batch = order[start:start + 32]
                got = reader.read_files([mnt / key for key in batch])
                failures.extend(key for key, data in zip(batch, got, strict=True)
                                if data != files[key])

    threads = [threading.Thread(target=read, args=(reader, 75 * index))
               for index, reader in enumerate(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures
    assert readers[0].status()["evictions"]["disk"] > 0, "the disk tier evicted meanwhile"


def daemon_hits(reader: Client) -> int:
    """Files the daemon has answered from its tiers so far: what a remembered location saves."""
    hits = reader.status()["hits"]
    return hits["disk"] + hits["ram"]


def remembered(reader: Client, paths: list) -> list[bytes]:
    """Reads `paths` until the daemon answers them in place, so this process remembers them."""
    reader.read_files(paths)
    wait_for_disk_tier(reader, paths)
    return reader.read_files(paths)


def remembered_data_dir(local_bucket, mount) -> tuple[dict[str, bytes], Path, Client, list]:
    """20 files of 16 KiB under data/, mounted and read until this process remembers them:
    (files by key, mountpoint, reader, paths)."""
    files = {f"data/{i:02d}.bin": payload(i, 16 * KiB + i) for i in range(20)}
    (local_bucket / "data").mkdir()
    for key, data in files.items():
        (local_bucket / key).write_bytes(data)
    mnt = mount(local_bucket.as_uri())
    reader = Client(mnt)
    paths = [mnt / key for key in files]
    assert remembered(reader, paths) == list(files.values())
    return files, mnt, reader, paths


def test_remembered_files_are_read_without_the_daemon_until_their_directory_changes(
        local_bucket, mount):
    files, mnt, reader, paths = remembered_data_dir(local_bucket, mount)
    hits = daemon_hits(reader)
    assert reader.read_files(paths) == list(files.values())
    assert daemon_hits(reader) == hits, "no request for files read in place before"

    (mnt / "logs").mkdir()
    (mnt / "logs" / "step.log").write_bytes(b"loss 0.1")
    reader.flush()
    assert reader.read_files(paths) == list(files.values())
    assert daemon_hits(reader) == hits, "writes elsewhere keep the locations"

    (mnt / "data" / "03.bin").write_bytes(b"rewritten")
    assert reader.read_files(paths[:5]) == [*list(files.values())[:3], b"rewritten", files["data/04.bin"]]
    reader.flush()
    assert reader.read_files([paths[3]]) == [b"rewritten"]
    assert remembered(Client(mnt), paths[4:])[0] == files["data/04.bin"]

    (mnt / "data" / "05.bin").unlink()
    with pytest.raises(FileNotFoundError):
        reader.read_files([paths[5]])
    os.rename(mnt / "data", mnt / "moved")
    with pytest.raises(FileNotFoundError):
        reader.read_files([paths[6]])
    assert reader.read_files([mnt / "moved" / "06.bin"]) == [files["data/06.bin"]]


def test_remembered_locations_expire_with_the_listings_they_came_from(local_bucket, mount):
    (local_bucket / "f.bin").write_bytes(payload(1, 20 * KiB))
    mnt = mount(local_bucket.as_uri(), "--metadata-ttl", "2")
    reader = Client(mnt)
    assert remembered(reader, [mnt / "f.bin"]) == [payload(1, 20 * KiB)]
    (local_bucket / "f.bin").write_bytes(payload(2, 20 * KiB))  # changed in the store
    assert reader.read_files([mnt / "f.bin"]) == [payload(1, 20 * KiB)], "within the TTL"
    time.sleep(2.2)
    assert reader.read_files([mnt / "f.bin"]) == [payload(2, 20 * KiB)]


def test_locations_remembered_from_an_earlier_daemon_are_dropped(local_bucket, mount):
    (local_bucket / "f.bin").write_bytes(payload(1, 20 * KiB))
    mnt = mount(local_bucket.as_uri())
    reader = Client(mnt)
    assert remembered(reader, [mnt / "f.bin"]) == [payload(1, 20 * KiB)]
    unmount(mnt)
    with pytest.raises(AvafsError, match="stopped answering|is not running|connect"):
        reader.read_files([mnt / "f.bin"])

    (local_bucket / "f.bin").write_bytes(payload(2, 20 * KiB))
    mount(local_bucket.as_uri(), mountpoint=mnt)
    assert reader.read_files([mnt / "f.bin"]) == [payload(2, 20 * KiB)]


def read_in_new_process(mnt, paths: list) -> list[bytes]:
    """`read_files` in a process of its own, as a DataLoader's fresh worker of a new epoch."""
    code = ("import pickle, sys; from avafs.client import Client; "
            "sys.stdout.buffer.write(pickle.dumps(Client(sys.argv[1]).read_files(sys.argv[2:])))")
    done = subprocess.run([sys.executable, "-c", code, str(mnt), *map(str, paths)],
                          capture_output=True, check=True, timeout=60)
    return pickle.loads(done.stdout)


def snapshot_holds(cache_dir, reader: Client, paths: list) -> None:
    """Waits until the daemon's snapshot (written in the background) names every path."""
    relatives = {reader.relative(path) for path in paths}
    deadline = time.monotonic() + 10
    while not relatives <= set(marshal.loads((cache_dir / LOCATIONS_FILE).read_bytes())[2]
                               if (cache_dir / LOCATIONS_FILE).exists() else ()):
        assert time.monotonic() < deadline, "the snapshot never caught up"
        time.sleep(0.05)


def test_a_new_reader_process_reads_what_earlier_ones_were_answered_without_asking(
        local_bucket, mount, tmp_path):
    files, mnt, reader, paths = remembered_data_dir(local_bucket, mount)
    snapshot_holds(tmp_path / "cache", reader, paths)
    hits = daemon_hits(reader)
    assert read_in_new_process(mnt, paths) == list(files.values())
    assert daemon_hits(reader) == hits, "the new process asked for nothing"

    (mnt / "data" / "03.bin").write_bytes(b"rewritten")
    expected = [*list(files.values())[:3], b"rewritten", *list(files.values())[4:]]
    assert read_in_new_process(mnt, paths) == expected
    assert daemon_hits(reader) > hits, "a snapshot from before the write is not trusted"

    unmount(mnt)
    assert not (tmp_path / "cache" / LOCATIONS_FILE).exists()
