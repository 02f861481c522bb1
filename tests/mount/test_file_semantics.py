"""POSIX file semantics through real mounts: files deleted or renamed while open, renames under
open writers, sparse files, long names, O_TRUNC of a file not yet uploaded."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import time

import pytest
from sample_data import payload
from support import store_bytes, store_keys, unmount

from avafs.client import Client
from avafs.host.processes import wait_for_exit

MiB = 2**20
GiB = 2**30


def puts_to(server, bucket: str) -> list[str]:
    """Uploads the store received for this bucket (PUT and POST requests)."""
    return [line for line in server.requests()
            if line.split()[0] in ("PUT", "POST") and line.split()[1].startswith(f"/{bucket}/")]


def dirty(mnt) -> dict:
    return Client(mnt).status()["dirty"]


def test_temporary_file_keeps_its_data_until_closed(s3_server, bucket, s3_mount):
    """tempfile.TemporaryFile unlinks the file at once and uses it through its descriptor."""
    mnt = s3_mount()
    data = payload(1, 100_000)
    with tempfile.TemporaryFile(dir=mnt) as file:
        file.write(data)
        file.flush()
        file.seek(0)
        assert file.read() == data
        assert os.fstat(file.fileno()).st_size == len(data)
        assert os.fstat(file.fileno()).st_nlink == 0
        Client(mnt).flush()  # nothing of it is pending: flush returns while it is open
        file.write(b"tail")
        file.flush()
        os.fsync(file.fileno())
        assert os.pread(file.fileno(), 200_000, 0) == data + b"tail"
        assert os.fstat(file.fileno()).st_size == len(data) + 4
        assert dirty(mnt)["bytes"] >= len(data)  # its bytes are on the local disk
    assert dirty(mnt) == {"bytes": 0, "files": 0, "upload_queue": 0, "uploading": 0,
                          "set_aside": []}
    Client(mnt).flush()
    assert store_keys(s3_server, bucket) == set()
    assert puts_to(s3_server, bucket) == []


def test_file_renamed_over_while_open_keeps_its_data(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    with open(mnt / "a.bin", "w+b") as old:
        old.write(b"old " * 1000)
        old.flush()
        (mnt / "b.bin").write_bytes(b"new")
        os.rename(mnt / "b.bin", mnt / "a.bin")
        old.write(b"more")
        old.flush()
        old.seek(0)
        assert old.read() == b"old " * 1000 + b"more"
        assert os.fstat(old.fileno()).st_size == 4004
        assert (mnt / "a.bin").read_bytes() == b"new"
        assert os.stat(mnt / "a.bin").st_size == 3
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "a.bin") == b"new"
    assert store_keys(s3_server, bucket) == {"a.bin"}
    assert dirty(mnt)["bytes"] == 0


def test_file_reopened_through_proc_after_unlink(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    fd = os.open(mnt / "gone.bin", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"before")
        os.unlink(mnt / "gone.bin")
        (mnt / "gone.bin").write_bytes(b"another file")
        with open(f"/proc/self/fd/{fd}", "r+b") as again:
            assert again.read() == b"before"
            again.write(b" after")
        assert os.pread(fd, 100, 0) == b"before after"
    finally:
        os.close(fd)
    assert (mnt / "gone.bin").read_bytes() == b"another file"
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "gone.bin") == b"another file"


@pytest.mark.parametrize("change", ["unlink", "rename over", "rename"])
def test_reader_of_a_clean_file_keeps_reading_after_it_is_gone(s3_server, bucket, s3_mount,
                                                               change):
    """Read the first block, let the deletion (or the rename's copy and delete) reach the
    store, then read the blocks that were never cached."""
    data = payload(2, 6 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="clean.bin", Body=data)
    mnt = s3_mount("--block-size", "1MiB", "--read-ahead", "0")
    with open(mnt / "clean.bin", "rb", buffering=0) as reader:
        assert reader.read(4096) == data[:4096]
        if change == "unlink":
            os.unlink(mnt / "clean.bin")
        elif change == "rename over":
            (mnt / "other.bin").write_bytes(b"replacement")
            os.rename(mnt / "other.bin", mnt / "clean.bin")
        else:
            os.rename(mnt / "clean.bin", mnt / "moved.bin")
        Client(mnt).flush()
        assert store_keys(s3_server, bucket) == {"unlink": set(), "rename over": {"clean.bin"},
                                                 "rename": {"moved.bin"}}[change]
        assert os.fstat(reader.fileno()).st_size == len(data)
        assert os.pread(reader.fileno(), len(data), 0) == data
    Client(mnt).flush()
    assert dirty(mnt)["bytes"] == 0


def test_directory_renamed_while_a_file_in_it_is_written(s3_server, bucket, s3_mount):
    """Reads and stat through the new path see every write before, during and after the
    upload, and nothing stays counted as dirty afterwards."""
    mnt = s3_mount()
    (mnt / "d1").mkdir()
    first, second = payload(3, 1000), payload(4, 1000)
    fd = os.open(mnt / "d1" / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, first)
        os.rename(mnt / "d1", mnt / "d2")
        os.write(fd, second)
        os.fsync(fd)
        assert (mnt / "d2" / "f").read_bytes() == first + second
    finally:
        os.close(fd)
    client = Client(mnt)
    for _ in range(200):  # until the upload settled, and a few reads after
        settled = client.status()["dirty"]["upload_queue"] == 0
        assert os.stat(mnt / "d2" / "f").st_size == 2000
        assert (mnt / "d2" / "f").read_bytes() == first + second
        if settled:
            break
    client.flush()
    assert os.stat(mnt / "d2" / "f").st_size == 2000
    assert (mnt / "d2" / "f").read_bytes() == first + second
    assert store_bytes(s3_server, bucket, "d2/f") == first + second
    assert store_keys(s3_server, bucket) == {"d2/", "d2/f"}
    assert dirty(mnt) == {"bytes": 0, "files": 0, "upload_queue": 0, "uploading": 0,
                          "set_aside": []}


def test_rename_of_a_file_being_written_survives_a_crash(s3_server, bucket, s3_mount):
    mnt = s3_mount("--writeback-delay", "3600")
    (mnt / "d1").mkdir()
    fd = os.open(mnt / "d1" / "f", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"a" * 1000)
    os.fsync(fd)
    os.rename(mnt / "d1", mnt / "d2")
    os.write(fd, b"b" * 1000)
    os.fsync(fd)
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    wait_for_exit(pid, 30)
    with contextlib.suppress(OSError):  # the daemon is gone
        os.close(fd)
    unmount(mnt)
    mnt = s3_mount(mountpoint=mnt)
    assert (mnt / "d2" / "f").read_bytes() == b"a" * 1000 + b"b" * 1000
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "d2/f") == b"a" * 1000 + b"b" * 1000


def test_sparse_file_counts_what_it_allocates(s3_server, bucket, s3_mount):
    mnt = s3_mount("--writeback-delay", "3600")
    path = mnt / "sparse.bin"
    with open(path, "wb") as file:
        file.seek(5 * GiB)
        file.write(b"x")
    status = os.stat(path)
    assert status.st_size == 5 * GiB + 1
    assert status.st_blocks * 512 < MiB
    assert dirty(mnt)["bytes"] < MiB
    stats = os.statvfs(mnt)
    assert stats.f_bavail * stats.f_frsize > 9 * GiB  # the disk tier lost no room to the hole
    os.truncate(path, 6 * GiB)
    assert os.stat(path).st_blocks * 512 < MiB
    assert dirty(mnt)["bytes"] < MiB
    with open(path, "rb") as file:
        file.seek(5 * GiB)
        assert file.read(2) == b"x\0"
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    wait_for_exit(pid, 30)
    unmount(mnt)
    mnt = s3_mount("--writeback-delay", "3600", mountpoint=mnt)
    assert dirty(mnt)["bytes"] < MiB  # measured again when the journal is loaded
    assert os.stat(mnt / "sparse.bin").st_size == 6 * GiB
    os.unlink(mnt / "sparse.bin")
    assert dirty(mnt)["bytes"] == 0


def test_names_longer_than_255_bytes_are_too_long(s3_server, bucket, s3_mount):
    mnt = s3_mount()
    (mnt / "dir").mkdir()
    (mnt / "file").write_bytes(b"f")
    long = "n" * 256
    for operation in (lambda: os.stat(mnt / long), lambda: os.open(mnt / long, os.O_CREAT | os.O_WRONLY),
                      lambda: os.mkdir(mnt / long), lambda: os.rename(mnt / "file", mnt / long),
                      lambda: os.rename(mnt / "dir", mnt / long), lambda: os.unlink(mnt / long),
                      lambda: os.rmdir(mnt / "dir" / long), lambda: os.listdir(mnt / long)):
        with pytest.raises(OSError) as error:
            operation()
        assert error.value.errno == errno.ENAMETOOLONG
    longest = "é" * 127 + "x"  # 255 bytes
    (mnt / longest).write_bytes(b"fits")
    os.rename(mnt / "file", mnt / "dir" / longest)
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, longest) == b"fits"
    assert store_bytes(s3_server, bucket, f"dir/{longest}") == b"f"


def test_open_with_o_trunc_truncates_a_file_not_yet_uploaded(s3_server, bucket, s3_mount):
    mnt = s3_mount("--writeback-delay", "3600")
    (mnt / "f.txt").write_bytes(b"long content here\n")
    (mnt / "f.txt").write_bytes(b"short\n")
    assert (mnt / "f.txt").read_bytes() == b"short\n"
    with open(mnt / "g.txt", "wb") as writer:
        writer.write(b"long content")
        writer.flush()
        with open(mnt / "g.txt", "wb") as truncating:
            truncating.write(b"x")
    assert (mnt / "g.txt").read_bytes() == b"x"
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "f.txt") == b"short\n"
    assert store_bytes(s3_server, bucket, "g.txt") == b"x"


def test_renames_of_a_clean_file_before_their_copies_land(s3_server, bucket, s3_mount):
    """mv ckpt ckpt.old; write a new ckpt; and a rename of a rename: the store's version of
    a name a pending copy reads is neither overwritten nor deleted before the copy lands."""
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="ckpt", Body=b"first checkpoint")
    client.put_object(Bucket=bucket, Key="a", Body=b"renamed twice")
    mnt = s3_mount("--writeback-delay", "3600")
    os.rename(mnt / "ckpt", mnt / "ckpt.old")
    (mnt / "ckpt").write_bytes(b"second checkpoint")
    os.rename(mnt / "a", mnt / "b")
    os.rename(mnt / "b", mnt / "c")
    Client(mnt).flush()
    assert store_keys(s3_server, bucket) == {"ckpt", "ckpt.old", "c"}
    assert store_bytes(s3_server, bucket, "ckpt.old") == b"first checkpoint"
    assert store_bytes(s3_server, bucket, "ckpt") == b"second checkpoint"
    assert store_bytes(s3_server, bucket, "c") == b"renamed twice"


def test_a_rename_whose_source_another_writer_deleted_is_dropped(s3_server, bucket, s3_mount,
                                                                  tmp_path):
    """mv a b, then another writer deletes `a` in the store before the copy lands: the copy
    cannot be made (the store has no `b`, as it had no copy of it already), the mount says
    so in its log and no longer shows `b`, and flush returns."""
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="a", Body=b"first")
    mnt = s3_mount("--writeback-delay", "3600")
    os.rename(mnt / "a", mnt / "b")
    client.delete_object(Bucket=bucket, Key="a")
    Client(mnt).flush()
    assert store_keys(s3_server, bucket) == set()
    assert os.listdir(mnt) == []
    assert "cannot finish renaming 'a' to 'b'" in (tmp_path / "cache" / "avafs.log").read_text()


def test_a_rename_whose_source_another_writer_replaced_keeps_that_writers_version(
        s3_server, bucket, s3_mount, tmp_path):
    """mv a b, then another writer puts a new `a` before the copy lands: the copy of the
    renamed version cannot be made, and the rename's deletion of `a` goes with it, so the
    other writer's `a` stays in the store and the mount shows it once the kernel's memory
    of `a` as absent (since the rename) expires with --metadata-ttl."""
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="a", Body=b"first")
    mnt = s3_mount("--writeback-delay", "3600", "--metadata-ttl", "1")
    os.rename(mnt / "a", mnt / "b")
    client.put_object(Bucket=bucket, Key="a", Body=b"the other writer's")
    assert Client(mnt).flush()["upload_queue"] == 0
    assert store_keys(s3_server, bucket) == {"a"}
    assert store_bytes(s3_server, bucket, "a") == b"the other writer's"
    assert "cannot finish renaming 'a' to 'b'" in (tmp_path / "cache" / "avafs.log").read_text()
    time.sleep(1.5)
    assert os.listdir(mnt) == ["a"]
    assert (mnt / "a").read_bytes() == b"the other writer's"


def test_files_swapped_by_renames_before_their_copies_land(s3_server, bucket, s3_mount):
    """mv a t; mv b a; mv t b (three files rotated the same way, two directories swapped
    too): each pending copy reads the key the other one changes, so neither could go first.
    The uploader copies one source in and uploads it as data: the store ends as the mount
    shows it, flush returns, and each file keeps its attributes (in the directories, never
    read by the mount: the source's mode and mtime from its metadata)."""
    client = s3_server.client()
    modes = {"a": 0o640, "b": 0o600, "x": 0o644, "y": 0o644, "z": 0o604, "p/f": 0o640,
             "q/f": 0o600}
    for name, mode in modes.items():
        client.put_object(Bucket=bucket, Key=name, Body=f"was {name}".encode() * 400_000,
                          Metadata={"mode": str(0o100000 | mode), "mtime": "1000000000.5"})
    mnt = s3_mount("--writeback-delay", "3600")
    for old, new in (("a", "t"), ("b", "a"), ("t", "b"), ("x", "t"), ("z", "x"), ("y", "z"),
                     ("t", "y"), ("p", "t"), ("q", "p"), ("t", "q")):
        os.rename(mnt / old, mnt / new)
    was = {"a": "b", "b": "a", "x": "z", "y": "x", "z": "y", "p/f": "q/f", "q/f": "p/f"}
    expected = {name: f"was {old}".encode() * 400_000 for name, old in was.items()}
    assert {name: (mnt / name).read_bytes() for name in expected} == expected
    assert Client(mnt).flush(timeout=60)["upload_queue"] == 0
    assert store_keys(s3_server, bucket) == set(expected) | {"p/", "q/"}  # their markers
    for name, data in expected.items():
        assert store_bytes(s3_server, bucket, name) == data
    metadata = {name: client.head_object(Bucket=bucket, Key=name)["Metadata"]
                for name in expected}
    assert {name: int(meta["mode"]) & 0o777 for name, meta in metadata.items()} == \
        {name: modes[old] for name, old in was.items()}
    assert {float(meta["mtime"]) for meta in metadata.values()} == {1000000000.5}


def test_file_opened_while_its_rename_is_copied_reads_on_after_the_copy(s3_server, bucket,
                                                                        s3_mount):
    data = payload(5, 6 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="before.bin", Body=data)
    mnt = s3_mount("--writeback-delay", "3600", "--block-size", "1MiB", "--read-ahead", "0")
    os.rename(mnt / "before.bin", mnt / "after.bin")
    with open(mnt / "after.bin", "rb", buffering=0) as reader:
        assert reader.read(4096) == data[:4096]
        Client(mnt).flush()  # the copy lands and the old name is deleted
        assert store_keys(s3_server, bucket) == {"after.bin"}
        assert os.pread(reader.fileno(), len(data), 0) == data


def _kill(mnt) -> None:
    """kill -9 the mount's daemon and detach the dead mount: its journal is left to replay."""
    pid = int(os.getxattr(mnt, "user.avafs.pid"))
    os.kill(pid, 9)
    wait_for_exit(pid, 30)
    unmount(mnt)


def test_file_looked_up_while_pending_reads_its_upload_after_a_remount(s3_server, bucket,
                                                                       s3_mount):
    """After a remount, a file is looked up while its replayed upload is pending (in a
    directory never listed), and opened once the upload landed: it reads the uploaded
    version, where it got ESTALE (its node kept the pending state's local ETag)."""
    mnt = s3_mount("--writeback-delay", "3600")
    (mnt / "d").mkdir()
    (mnt / "d" / "f").write_bytes(b"acknowledged")
    _kill(mnt)
    mnt = s3_mount("--writeback-delay", "3600", mountpoint=mnt)
    assert (mnt / "d" / "f").stat().st_size == len(b"acknowledged")
    Client(mnt).flush()
    assert store_bytes(s3_server, bucket, "d/f") == b"acknowledged"
    assert (mnt / "d" / "f").read_bytes() == b"acknowledged"


def test_directory_renamed_before_a_crash_lists_every_file_while_its_copies_land(
        s3_server, bucket, s3_mount, proxy):
    """A directory of uploaded files is renamed, the daemon killed before the copies land, and
    the next mount lists the new directory while the replayed copies land, through a slow
    store: every file is listed and reads back. A listing the store answered before some
    copies landed, arriving after them, hid those files until --metadata-ttl."""
    files = {f"f{number:03}": payload(number, 100) for number in range(200)}
    mnt = s3_mount("--writeback-delay", "3600", endpoint=proxy.endpoint)
    (mnt / "d1").mkdir()
    for name, data in files.items():
        (mnt / "d1" / name).write_bytes(data)
    Client(mnt).flush()
    os.rename(mnt / "d1", mnt / "d2")
    _kill(mnt)
    proxy.rate, proxy.mode = 64 * 1024, "slow"
    mnt = s3_mount("--writeback-delay", "0", endpoint=proxy.endpoint, mountpoint=mnt)
    deadline = time.monotonic() + 60  # list once some copies landed: a long answer, slowly
    while len([key for key in store_keys(s3_server, bucket) if key.startswith("d2/f")]) < 60:
        assert time.monotonic() < deadline, "the replayed copies do not land"
        time.sleep(0.05)
    assert sorted(os.listdir(mnt / "d2")) == sorted(files)
    proxy.mode = "pass"
    for name, data in files.items():
        assert (mnt / "d2" / name).read_bytes() == data
    Client(mnt).flush()
    assert {key for key in store_keys(s3_server, bucket) if not key.endswith("/")} == {
        f"d2/{name}" for name in files}
