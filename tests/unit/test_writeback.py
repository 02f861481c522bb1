"""Write-back's bookkeeping without FUSE or root: pending states, the journal across a restart,
uploads set aside on a permanent refusal, and back-pressure, over a local bucket."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

import pytest
from local_writeback import LocalWriteSide, MiB, store_files

from avafs.errors import StoreError
from avafs.stores.base import ObjectInfo
from avafs.stores.local import LocalStore
from avafs.stores.metadata import Attrs
from avafs.writeback import uploader
from avafs.writeback.pending import DATA, DELETED


class PolicyStore(LocalStore):
    """A local bucket with a write policy, as a bucket policy refuses some keys for good."""

    def __init__(self, root: Path, refused_prefix: str) -> None:
        super().__init__(root)
        self.refused_prefix = refused_prefix

    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
        if key.startswith(self.refused_prefix):
            raise StoreError(f"access denied to {key}", permanent=True)
        return super().put(key, body, size, mtime, attrs)


class MeteredStore(LocalStore):
    """A local bucket whose every PUT lasts a while, as a distant store's does, and which
    notes the sizes of the PUTs in flight when each starts."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self.seen: list[tuple[str, dict[str, int]]] = []

    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
        with self._lock:
            self._in_flight[key] = size
            self.seen.append((key, dict(self._in_flight)))
        try:
            time.sleep(0.2)
            return super().put(key, body, size, mtime, attrs)
        finally:
            with self._lock:
                del self._in_flight[key]


def test_a_committed_write_is_pending_and_dirty_until_flushed(side):
    side.write("a.bin", b"x" * 5000)
    pending = side.writeback.get("", "a.bin")
    assert pending is not None and pending.kind == DATA and pending.durable
    assert side.writeback.status()["bytes"] == 8192  # two 4 KiB blocks on disk
    assert store_files(side.bucket) == {}
    status = side.flush()
    assert status["upload_queue"] == 0 and status["bytes"] == 0
    assert store_files(side.bucket) == {"a.bin": b"x" * 5000}
    assert side.writeback.get("", "a.bin") is None
    assert list((side.directory / "writeback" / "data").iterdir()) == []


def test_rewriting_a_pending_file_replaces_its_state(side):
    side.write("a.bin", b"first")
    side.write("a.bin", b"second, longer")
    assert side.writeback.status()["upload_queue"] == 1
    side.flush()
    assert store_files(side.bucket) == {"a.bin": b"second, longer"}


def test_an_append_copies_the_stored_object_in_first(side):
    (side.bucket / "log.txt").write_bytes(b"old line\n")
    side.write("log.txt", b"new line\n", truncate=False)
    assert side.read("log.txt") == b"old line\nnew line\n"
    side.flush()
    assert store_files(side.bucket) == {"log.txt": b"old line\nnew line\n"}


def test_unlink_of_a_pending_file_uploads_nothing(side):
    side.write("a.bin", b"data")
    side.unlink("a.bin")
    assert side.writeback.get("", "a.bin").kind == DELETED
    assert side.writeback.status()["bytes"] == 0  # the data file went with its state
    side.flush()
    assert store_files(side.bucket) == {}
    assert side.writeback.status()["upload_queue"] == 0


def test_the_journal_replays_after_a_restart(side):
    side.write("a.bin", b"a" * 100)
    side.write("b.bin", b"b" * 200)
    side.unlink("b.bin")
    side.restart()
    assert side.writeback.get("", "a.bin").size == 100
    assert side.writeback.get("", "b.bin").kind == DELETED
    assert side.names() == ["a.bin"]
    side.flush()
    assert store_files(side.bucket) == {"a.bin": b"a" * 100}


def test_a_file_written_but_never_committed_is_dropped_at_restart(side):
    pending = side.writeback.open_writer("", "torn.bin", None, True)
    side.writeback.data_path(pending).write_bytes(b"never closed")
    side.restart()
    assert side.writeback.get("", "torn.bin") is None
    assert list((side.directory / "writeback" / "data").iterdir()) == []


def test_a_permanent_refusal_is_set_aside_kept_and_named(tmp_path):
    side = LocalWriteSide(tmp_path, store=PolicyStore(tmp_path / "bucket", "denied/"))
    try:
        (side.bucket / "denied").mkdir()
        side.write("denied/a.bin", b"refused")
        side.write("fine.bin", b"taken")
        status = side.flush(timeout=20)
        assert [aside["key"] for aside in status["set_aside"]] == ["denied/a.bin"]
        assert "access denied" in status["set_aside"][0]["error"]
        assert store_files(side.bucket) == {"fine.bin": b"taken"}
        refused = side.writeback.get("", "denied/a.bin")
        assert side.writeback.data_path(refused).read_bytes() == b"refused"
        side.restart()  # kept in the journal: the next daemon tries it again
        assert [entry.key for entry in side.writeback.set_aside()] == []
        assert side.writeback.get("", "denied/a.bin").file is not None
    finally:
        side.close()


def test_a_rewrite_gives_a_set_aside_file_a_new_chance(tmp_path):
    store = PolicyStore(tmp_path / "bucket", "denied/")
    side = LocalWriteSide(tmp_path, store=store)
    try:
        (side.bucket / "denied").mkdir()
        side.write("denied/a.bin", b"refused")
        assert side.flush(timeout=20)["set_aside"]
        store.refused_prefix = "nothing-is-refused/"
        side.write("denied/a.bin", b"accepted now")
        assert side.writeback.set_aside() == []
        assert side.flush()["set_aside"] == []
        assert store_files(side.bucket) == {"denied/a.bin": b"accepted now"}
    finally:
        side.close()


def test_back_pressure_holds_writers_past_the_dirty_limit_and_hurries_uploads(tmp_path):
    side = LocalWriteSide(tmp_path, dirty_limit=16 * 1024)
    try:
        side.write("a.bin", b"a" * 32 * 1024)
        assert not side.writeback.room_to_write()  # over the limit, and waiting can help
        side.start_uploads()  # with the delay skipped, the upload starts at once
        deadline = time.monotonic() + 20
        while not side.writeback.room_to_write():
            assert time.monotonic() < deadline, "uploads never made room"
            time.sleep(0.05)
        assert store_files(side.bucket) == {"a.bin": b"a" * 32 * 1024}
    finally:
        side.close()


def test_back_pressure_lets_writes_through_when_only_open_files_are_dirty(tmp_path):
    side = LocalWriteSide(tmp_path, dirty_limit=4096)
    try:
        pending = side.writeback.open_writer("", "open.bin", None, True)
        side.writeback.wrote(pending, 0, 64 * 1024)
        assert side.writeback.over_dirty_limit()
        assert side.writeback.room_to_write()  # waiting could not help: it is still open
        assert not side.writeback.eager
    finally:
        side.close()


def test_no_space_once_the_disk_is_all_dirty_and_the_store_long_unreachable(tmp_path):
    side = LocalWriteSide(tmp_path, dirty_limit=4096, disk_capacity=8192)
    try:
        side.write("a.bin", b"a" * 8192)
        side.writeback.store_unreachable_since = time.monotonic() - 60
        with pytest.raises(OSError) as raised:
            side.writeback.room_to_write()
        assert raised.value.errno == errno.ENOSPC
        side.writeback.store_unreachable_since = time.monotonic()
        assert not side.writeback.room_to_write()  # a blip: wait for uploads instead
    finally:
        side.close()


def test_a_sparse_file_counts_the_blocks_it_has(side):
    pending = side.writeback.open_writer("", "sparse.bin", None, True)
    fd = os.open(side.writeback.data_path(pending), os.O_RDWR)
    try:
        side.writeback.wrote(pending, 10 * MiB, 10 * MiB + 4096)
        os.pwrite(fd, b"z" * 4096, 10 * MiB)
        side.writeback.measure(pending, fd)
        assert side.writeback.status()["bytes"] < MiB
        side.writeback.commit(pending, fd)
    finally:
        os.close(fd)
        side.writeback.release_writer(pending)


def test_uploads_go_up_together_within_their_memory_budget(tmp_path, monkeypatch):
    """Many small files go up at once (one uploader each); what the uploads hold together stays
    within the budget; a file larger than the whole budget still goes up, alone."""
    monkeypatch.setattr(uploader, "UPLOAD_MEMORY", 256 * 1024)
    store = MeteredStore(tmp_path / "bucket")
    side = LocalWriteSide(tmp_path, store=store)
    try:
        small = {f"small/{index:02d}.bin": os.urandom(4096) for index in range(12)}
        large = {f"large/{index}.bin": os.urandom(100 * 1024) for index in range(4)}
        huge = {"huge.bin": os.urandom(300 * 1024)}
        for directory in ("small", "large"):
            (side.bucket / directory).mkdir()
        for path, data in {**small, **large, **huge}.items():
            side.write(path, data)
        side.uploader = uploader.Uploader(side.writeback, {"": store}, workers=16)
        assert side.flush(timeout=60)["upload_queue"] == 0
        assert store_files(side.bucket) == {**small, **large, **huge}
        assert max(len(flight) for _, flight in store.seen) >= 8
        for key, flight in store.seen:
            if key == "huge.bin":
                assert flight == {"huge.bin": 300 * 1024}
            else:
                assert sum(flight.values()) <= 256 * 1024, flight
    finally:
        side.close()
