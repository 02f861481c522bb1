"""Small files of a directory read in name order are fetched ahead of their readers
(avafs/fuse/read_ahead.py), through real mounts of a moto bucket: each file still costs one
GET and no HEAD, whether its reader's lookup finds it fetched or waits for its fetch under way;
readers each in their own part of a directory are each followed; a shuffled reader's files are
not fetched ahead; a file replaced in the store after its directory was listed reads as the
store has it now, fetched ahead or not. With `--listing-attrs`, first reads are followed
instead of lookups."""

from __future__ import annotations

import os
import random
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support import S3Server, object_gets

from avafs.client import Client

FILES = 120


def _body(number: int, version: int = 0) -> bytes:
    return f"{number}.{version}.".encode() * (100 + number)


def _names() -> list[str]:
    return [f"data/{number:04d}.bin" for number in range(FILES)]


def _store(server: S3Server, bucket: str) -> None:
    client = server.client()
    for number, name in enumerate(_names()):
        client.put_object(Bucket=bucket, Key=name, Body=_body(number),
                          Metadata={"mode": str(stat.S_IFREG | 0o640)})


def _file_heads(server: S3Server, bucket: str) -> int:
    return sum(1 for line in server.requests() if line.startswith(f"HEAD /{bucket}/data/")
               and not line.split()[1].endswith("/"))


def _read(mnt: Path, name: str) -> tuple[bytes, int]:
    path = mnt / name
    return path.read_bytes(), stat.S_IMODE(os.stat(path).st_mode)


def test_files_read_in_name_order_are_fetched_ahead_one_get_each(s3_server, bucket, s3_mount):
    _store(s3_server, bucket)
    mnt = s3_mount()
    os.listdir(mnt / "data")
    gets, heads = object_gets(s3_server, bucket), _file_heads(s3_server, bucket)
    for number, name in enumerate(_names()):
        assert _read(mnt, name) == (_body(number), 0o640)
    assert Client(mnt).status()["read_ahead_files"] >= FILES - 10
    assert object_gets(s3_server, bucket) - gets == FILES
    assert _file_heads(s3_server, bucket) == heads


def test_readers_that_take_files_in_turn_wait_for_the_fetch_under_way(
        s3_server, bucket, s3_mount):
    """Eight readers, each taking the next file: lookups overtake the fetches ahead of them,
    and wait for those rather than sending a GET or a HEAD of their own."""
    _store(s3_server, bucket)
    mnt = s3_mount()
    os.listdir(mnt / "data")
    gets, heads = object_gets(s3_server, bucket), _file_heads(s3_server, bucket)
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda name: _read(mnt, name), _names()))
    assert found == [(_body(number), 0o640) for number in range(FILES)]
    assert Client(mnt).status()["read_ahead_files"] > FILES // 2
    assert object_gets(s3_server, bucket) - gets == FILES
    assert _file_heads(s3_server, bucket) == heads


def test_readers_each_in_a_part_of_their_own_are_each_followed(s3_server, bucket, s3_mount):
    """Four readers each reading a quarter of the directory in order, their lookups taking
    turns (as a `DataLoader`'s workers without shuffling do, each with batches of its own):
    together they are out of order, each alone is in order, and each gets its files fetched
    ahead, one GET per file still."""
    _store(s3_server, bucket)
    mnt = s3_mount()
    os.listdir(mnt / "data")
    gets, heads = object_gets(s3_server, bucket), _file_heads(s3_server, bucket)
    readers, names = 4, _names()
    part = FILES // readers
    turns = threading.Barrier(readers)

    def read_part(reader: int) -> list[tuple[bytes, int]]:
        found = []
        for name in names[reader * part:(reader + 1) * part]:
            turns.wait()
            found.append(_read(mnt, name))
        return found

    with ThreadPoolExecutor(readers) as pool:
        found = [each for part_found in pool.map(read_part, range(readers))
                 for each in part_found]
    assert found == [(_body(number), 0o640) for number in range(FILES)]
    assert Client(mnt).status()["read_ahead_files"] > FILES // 2
    assert object_gets(s3_server, bucket) - gets == FILES
    assert _file_heads(s3_server, bucket) == heads


def test_a_shuffled_readers_files_are_not_fetched_ahead(s3_server, bucket, s3_mount):
    _store(s3_server, bucket)
    mnt = s3_mount()
    os.listdir(mnt / "data")
    gets = object_gets(s3_server, bucket)
    order = list(enumerate(_names()))
    random.Random(7).shuffle(order)
    for number, name in order:
        assert _read(mnt, name) == (_body(number), 0o640)
    assert Client(mnt).status()["read_ahead_files"] == 0
    assert object_gets(s3_server, bucket) - gets == FILES


def test_files_replaced_after_the_listing_read_as_the_store_has_them(
        s3_server, bucket, s3_mount):
    """The fetches ahead ask for the listed version, which the store no longer has: they are
    dropped, and each file's reader reads the version the store has now."""
    _store(s3_server, bucket)
    mnt = s3_mount()
    os.listdir(mnt / "data")
    replaced = set(range(20, 60))
    client = s3_server.client()
    for number in replaced:
        client.put_object(Bucket=bucket, Key=_names()[number], Body=_body(number, 1),
                          Metadata={"mode": str(stat.S_IFREG | 0o600)})
    for number, name in enumerate(_names()):
        expected = (_body(number, 1), 0o600) if number in replaced else (_body(number), 0o640)
        assert _read(mnt, name) == expected, name
    assert Client(mnt).status()["read_ahead_files"] >= FILES - len(replaced) - 10


def test_with_listing_attrs_first_reads_in_order_are_followed_and_stats_fetch_nothing(
        s3_server, bucket, s3_mount):
    """A lookup sends no request there, so a walk that stats every file fetches nothing;
    readers taking the files in turn get them fetched ahead, one GET each, and a read that
    overtakes a fetch waits for it."""
    _store(s3_server, bucket)
    mnt = s3_mount("--listing-attrs", "--read-only")
    gets = object_gets(s3_server, bucket)
    assert [os.stat(mnt / name).st_size for name in _names()] == \
        [len(_body(number)) for number in range(FILES)]
    assert object_gets(s3_server, bucket) == gets
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda name: (mnt / name).read_bytes(), _names()))
    assert found == [_body(number) for number in range(FILES)]
    assert Client(mnt).status()["read_ahead_files"] > FILES // 2
    assert object_gets(s3_server, bucket) - gets == FILES
