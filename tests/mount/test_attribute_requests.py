"""How many requests a file's attributes cost at the defaults, through real mounts of a moto
bucket: a small file's first `stat` is answered by the GET that brings its bytes (no HEAD, and
its read is then a hit), a larger file's by a HEAD, and a remount on the same cache dir knows
what was read before (no request per file), unless the object changed in between; a warmup's
GET of a small file reads its attributes too, so the first `stat` after it sends nothing.
Files looked up by path in one directory, never listed, have their attributes read side by
side, and a reader the object's mode shuts out is refused from the first `open`."""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from support import S3Server, as_nobody, object_gets, run_avafs, unmount

from avafs.fuse.kernel import PARALLEL_LOOKUPS
from bench.servers.fault_proxy import FaultProxy

MiB = 2**20
SMALL = {f"data/{number}.bin": bytes([number]) * (1000 + number) for number in range(5)}
LINK_TARGET = b"data/0.bin"


def _heads(server: S3Server, bucket: str) -> int:
    """HEADs of files (a directory's marker is read once per directory, not counted)."""
    return sum(1 for line in server.requests() if line.startswith(f"HEAD /{bucket}/")
               and not line.split()[1].endswith("/"))


def _dataset(server: S3Server, bucket: str) -> None:
    client = server.client()
    for key, body in SMALL.items():
        client.put_object(Bucket=bucket, Key=key, Body=body,
                          Metadata={"mode": str(stat.S_IFREG | 0o600), "uid": "123"})
    client.put_object(Bucket=bucket, Key="data/link", Body=LINK_TARGET,
                      Metadata={"mode": str(stat.S_IFLNK | 0o777)})


def _dataset_read_once(server: S3Server, bucket: str, s3_mount, cache: Path) -> Path:
    """The dataset stored, mounted on `cache`, stat'ed once; returns the mountpoint."""
    _dataset(server, bucket)
    mnt = s3_mount(cache_dir=cache)
    _check_dataset(mnt)
    return mnt


def _check_dataset(mnt: Path) -> None:
    for key, body in SMALL.items():
        found = os.stat(mnt / key)
        assert (stat.S_IMODE(found.st_mode), found.st_uid, found.st_size) == \
            (0o600, 123, len(body))
    assert os.readlink(mnt / "data/link") == LINK_TARGET.decode()


def test_a_small_files_first_stat_costs_the_get_its_read_needs_and_no_head(
        s3_server, bucket, s3_mount):
    _dataset(s3_server, bucket)
    mnt = s3_mount()
    heads, gets = _heads(s3_server, bucket), object_gets(s3_server, bucket)
    _check_dataset(mnt)
    assert _heads(s3_server, bucket) == heads
    assert object_gets(s3_server, bucket) == gets + len(SMALL) + 1
    for key, body in SMALL.items():
        assert (mnt / key).read_bytes() == body
    assert object_gets(s3_server, bucket) == gets + len(SMALL) + 1


def test_a_small_files_first_read_after_its_lookup_is_answered_from_the_lookups_bytes(
        s3_server, bucket, s3_mount, tmp_path):
    """Not from the disk tier's file of the block (written a moment before): its bytes
    damaged in the cache dir after the `stat`, the read still gives the object's bytes,
    with no second GET (a read of the damaged file would drop it and fetch it again)."""
    _dataset(s3_server, bucket)
    cache = tmp_path / "cache"
    mnt = s3_mount(cache_dir=cache)
    key, body = "data/3.bin", SMALL["data/3.bin"]
    os.stat(mnt / key)
    gets = object_gets(s3_server, bucket)
    block_files = [path for path in (cache / "disk").rglob("*")
                   if path.is_file() and path.stat().st_size == len(body)
                   and path.read_bytes() == body]
    assert len(block_files) == 1
    block_files[0].write_bytes(b"x" * len(body))

    assert (mnt / key).read_bytes() == body
    assert object_gets(s3_server, bucket) == gets


def test_a_remount_on_the_same_cache_dir_reads_no_attributes_again(
        s3_server, bucket, s3_mount, tmp_path):
    cache = tmp_path / "kept-cache"
    mnt = _dataset_read_once(s3_server, bucket, s3_mount, cache)
    (mnt / "data/written.txt").write_bytes(b"written here")
    os.chmod(mnt / "data/written.txt", 0o640)
    unmount(mnt)
    heads, gets = _heads(s3_server, bucket), object_gets(s3_server, bucket)
    mnt = s3_mount(cache_dir=cache, mountpoint=tmp_path / "again")
    _check_dataset(mnt)
    assert stat.S_IMODE(os.stat(mnt / "data/written.txt").st_mode) == 0o640
    for key, body in SMALL.items():
        assert (mnt / key).read_bytes() == body
    assert (_heads(s3_server, bucket), object_gets(s3_server, bucket)) == (heads, gets)


def test_attributes_changed_in_place_by_another_tool_are_read_again_after_a_remount(
        s3_server, bucket, s3_mount, tmp_path):
    cache = tmp_path / "kept-cache"
    unmount(_dataset_read_once(s3_server, bucket, s3_mount, cache))
    time.sleep(1.1)  # a new write time, whatever the store's precision
    key = "data/1.bin"
    s3_server.client().copy_object(
        Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
        Metadata={"mode": str(stat.S_IFREG | 0o604)}, MetadataDirective="REPLACE")
    mnt = s3_mount(cache_dir=cache, mountpoint=tmp_path / "again")
    assert stat.S_IMODE(os.stat(mnt / key).st_mode) == 0o604
    assert stat.S_IMODE(os.stat(mnt / "data/2.bin").st_mode) == 0o600
    assert (mnt / key).read_bytes() == SMALL[key]


def test_a_large_files_first_stat_is_one_head_and_no_get(s3_server, bucket, s3_mount):
    s3_server.client().put_object(Bucket=bucket, Key="large.bin", Body=b"x" * (2 * MiB),
                                  Metadata={"mode": str(stat.S_IFREG | 0o640)})
    mnt = s3_mount()
    os.listdir(mnt)
    heads, gets = _heads(s3_server, bucket), object_gets(s3_server, bucket)
    assert stat.S_IMODE(os.stat(mnt / "large.bin").st_mode) == 0o640
    assert (_heads(s3_server, bucket), object_gets(s3_server, bucket)) == (heads + 1, gets)


def test_a_file_replaced_after_its_listing_shows_the_new_version(s3_server, bucket, s3_mount):
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="swapped.txt", Body=b"old")
    mnt = s3_mount("--metadata-ttl", "1h")
    os.listdir(mnt)
    client.put_object(Bucket=bucket, Key="swapped.txt", Body=b"brand new",
                      Metadata={"mode": str(stat.S_IFREG | 0o606)})
    found = os.stat(mnt / "swapped.txt")
    assert (stat.S_IMODE(found.st_mode), found.st_size) == (0o606, len(b"brand new"))
    assert (mnt / "swapped.txt").read_bytes() == b"brand new"


def test_a_warmup_reads_small_files_attributes_with_their_bytes(s3_server, bucket, s3_mount,
                                                                 tmp_path):
    _dataset(s3_server, bucket)
    cache = tmp_path / "warmed-cache"
    mnt = s3_mount(cache_dir=cache)
    heads, gets = _heads(s3_server, bucket), object_gets(s3_server, bucket)
    result = run_avafs("warmup", str(mnt / "data"))
    assert result.returncode == 0, result.stderr
    assert (_heads(s3_server, bucket), object_gets(s3_server, bucket)) == \
        (heads, gets + len(SMALL) + 1), "one GET per file, no HEAD"
    _check_dataset(mnt)
    for key, body in SMALL.items():
        assert (mnt / key).read_bytes() == body
    assert (_heads(s3_server, bucket), object_gets(s3_server, bucket)) == \
        (heads, gets + len(SMALL) + 1), "stat and read after the warmup: no request"
    unmount(mnt)
    mnt = s3_mount(cache_dir=cache, mountpoint=tmp_path / "again")
    _check_dataset(mnt)
    assert (_heads(s3_server, bucket), object_gets(s3_server, bucket)) == \
        (heads, gets + len(SMALL) + 1), "a remount knows what the warmup read"


def _owned_files(server: S3Server, bucket: str, count: int, size: int) -> dict[str, bytes]:
    """`count` files of one directory, each of `size` bytes, mode 0600 and uid 123."""
    files = {f"flat/{number:03d}.jpg": bytes([number]) * size for number in range(count)}
    client = server.client()
    for key, body in files.items():
        client.put_object(Bucket=bucket, Key=key, Body=body,
                          Metadata={"mode": str(stat.S_IFREG | 0o600), "uid": "123"})
    return files


def _read_by_path_through_a_slow_link(server: S3Server, bucket: str, s3_mount,
                                      size: int) -> None:
    """24 files of one directory read by path by 8 readers through a link 0.2 s away: their
    attributes right, one GET each, and well under the 24 x 0.2 s of one GET after another."""
    files = _owned_files(server, bucket, 24, size)
    proxy = FaultProxy(server.port, rate=64 * MiB, latency=0.2)
    try:
        mnt = s3_mount(endpoint=proxy.endpoint)
        os.listdir(mnt)
        proxy.mode = "link"
        gets, found = object_gets(server, bucket), {}

        def read(keys: list[str]) -> None:
            for key in keys:
                status = os.stat(mnt / key)
                found[key] = (stat.S_IMODE(status.st_mode), status.st_uid,
                              (mnt / key).read_bytes())

        started = time.monotonic()
        readers = [threading.Thread(target=read, args=(list(files)[i::8],)) for i in range(8)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        elapsed = time.monotonic() - started
        assert found == {key: (0o600, 123, body) for key, body in files.items()}
        assert object_gets(server, bucket) == gets + len(files)
        assert elapsed < len(files) * proxy.latency / 2, f"{elapsed:.1f} s: one after another"
    finally:
        proxy.close()


def test_files_looked_up_by_path_in_one_directory_are_described_side_by_side(
        s3_server, bucket, s3_mount):
    """The kernel holds a directory's lock through each LOOKUP of a name new to it unless
    the file system asked for parallel directory operations. A file too large to be a link
    is described side by side whichever libfuse runs: by its LOOKUP where lookups go in
    parallel, else by the GETATTR after it, outside that lock."""
    _read_by_path_through_a_slow_link(s3_server, bucket, s3_mount, 8192)


@pytest.mark.skipif(not PARALLEL_LOOKUPS, reason="pyfuse3 runs on a libfuse older than 3.16, "
                    "which cannot ask for parallel directory operations (scripts/build_libfuse.sh)")
def test_small_files_looked_up_by_path_in_one_directory_are_described_side_by_side(
        s3_server, bucket, s3_mount):
    """A file of 4 KiB or less may be a link, so its LOOKUP waits for the GET that says what
    it is: side by side only with parallel directory operations."""
    _read_by_path_through_a_slow_link(s3_server, bucket, s3_mount, 1000)


def test_a_mode_read_with_the_first_open_refuses_a_reader_it_shuts_out(
        s3_server, bucket, s3_mount):
    files = _owned_files(s3_server, bucket, 1, 8192)
    mnt = s3_mount("--allow-other")
    path = mnt / next(iter(files))

    def read() -> str:
        return str(len(path.read_bytes()))

    assert as_nobody(read) == f"PermissionError {errno.EACCES}"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
