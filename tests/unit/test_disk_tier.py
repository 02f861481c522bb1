"""The disk tier's start-up sweep of block files a crash left unindexed, its checks of the
block files it reads, and the folders it makes for them.

The sweep runs in the background while the mount already caches blocks, so it must tell a
crash's leftovers from files written after it listed the index: once, it took the latter for
the former and deleted blocks readers had just fetched; and a sweep that outlived its tier's
`close` took the next tier's blocks for leftovers. A block file whose size does not match its
record is dropped, not served, and so is one whose checksum (CRC-32C, or CRC-32 in records
from before) does not, until the block is checked: after a crash, but not after a clean close,
which syncs every block and leaves a marker that the next open takes away.
A file written through the mount may be adopted as a block once the store has it: moved into
place and indexed as if fetched, or left where it is when the tier does not take it.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from avafs.objects import BlockId
from avafs.tiers import disk
from avafs.tiers.disk import DiskTier

MIB = 1024 * 1024


def _block(index: int) -> BlockId:
    return BlockId("file:///bucket", "data", "etag", index)


def _tier(root: Path, tier_class: type[DiskTier] = DiskTier) -> DiskTier:
    return tier_class(root, 64 * MIB, 1000, 0.9, 0.7)


def _block_file(root: Path, block: BlockId) -> Path:
    return root / "blocks" / block.file_name()[:2] / block.file_name()


def _as_after_a_crash(root: Path) -> None:
    """What a crash leaves where a clean close left its tier synced: no marker."""
    (root / "synced").unlink()


def _leave_unindexed_file(root: Path, block: BlockId) -> Path:
    """What a crash between a block's rename into place and its index write leaves."""
    path = root / "blocks" / block.file_name()[:2] / block.file_name()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left by a crash")
    return path


class _GatedSweepTier(DiskTier):
    """Holds the sweep after it has listed the index and before it looks at any file."""

    def __init__(self, *args: object) -> None:
        self.gate = threading.Event()
        super().__init__(*args)

    def _block_files(self) -> Iterator[Path]:
        assert self.gate.wait(10), "the test never opened the gate"
        yield from super()._block_files()


def test_a_file_left_unindexed_by_a_crash_is_removed_at_start(tmp_path):
    _tier(tmp_path).close()
    leftover = _leave_unindexed_file(tmp_path, _block(7))

    tier = _tier(tmp_path)
    tier._sweeper.join(10)

    assert not leftover.exists()
    tier.close()


def test_blocks_written_while_the_sweep_runs_survive_it(tmp_path):
    _tier(tmp_path).close()
    _leave_unindexed_file(tmp_path, _block(99))
    tier = _tier(tmp_path, _GatedSweepTier)
    written = {_block(index): bytes([index]) * 4096 for index in range(20)}
    for block, data in written.items():
        tier.put(block, data)

    tier.gate.set()
    tier._sweeper.join(10)

    assert not tier._sweeper.is_alive()
    assert {block: tier.get(block) for block in written} == written
    assert tier.get(_block(99)) is None
    tier.close()


def test_a_crash_leftover_rewritten_while_the_sweep_runs_is_kept(tmp_path):
    _tier(tmp_path).close()
    _leave_unindexed_file(tmp_path, _block(3))
    tier = _tier(tmp_path, _GatedSweepTier)
    tier.put(_block(3), b"fetched again")

    tier.gate.set()
    tier._sweeper.join(10)

    assert tier.get(_block(3)) == b"fetched again"
    tier.close()


def _rewrite_records_as_crc32(root: Path) -> None:
    """Turns the index into what a tier from before CRC-32C left: size, CRC-32, sequence,
    reads."""
    import zlib

    from rocksdict import Options, Rdict

    index = Rdict(str(root / "index"), options=Options(raw_mode=True))
    for key, value in list(index.items()):
        size, _, sequence, reads, _ = struct.unpack("<QIQIB", value)
        block = BlockId.decode(key.decode())
        data = (root / "blocks" / block.file_name()[:2] / block.file_name()).read_bytes()
        index[key] = struct.pack("<QIQI", size, zlib.crc32(data), sequence, reads)
    index.close()


def test_blocks_recorded_with_a_crc32_are_still_served_and_still_checked(tmp_path):
    tier = _tier(tmp_path)
    tier.put(_block(1), b"kept" * 1000)
    tier.put(_block(2), b"torn" * 1000)
    tier.close()
    _as_after_a_crash(tmp_path)
    _rewrite_records_as_crc32(tmp_path)
    _block_file(tmp_path, _block(2)).write_bytes(b"torn" * 999 + b"TORN")

    tier = _tier(tmp_path)
    try:
        assert tier.get(_block(1)) == b"kept" * 1000
        assert tier.get(_block(2)) is None, "a block that fails its CRC-32 is dropped"
        assert _block(2) not in tier
    finally:
        tier.close()


@pytest.mark.parametrize("damage", [
    lambda data: data + b"x",          # grew
    lambda data: data[:-1],            # cut short
    lambda data: data[:-1] + b"?",     # same size, other bytes: the checksum tells
])
def test_a_block_file_damaged_by_a_crash_is_dropped_on_read(tmp_path, damage):
    tier = _tier(tmp_path)
    data = bytes(range(256)) * 64
    tier.put(_block(3), data)
    tier.close()
    _as_after_a_crash(tmp_path)
    _block_file(tmp_path, _block(3)).write_bytes(damage(data))

    tier = _tier(tmp_path)
    try:
        assert tier.get(_block(3)) is None
        assert _block(3) not in tier
    finally:
        tier.close()


def _counting_checksums(monkeypatch) -> list[int]:
    """Sizes of the blocks whose checksum the tier computes from now on."""
    summed: list[int] = []
    checksums = {kind: (lambda data, sum_=sum_: summed.append(len(data)) or sum_(data))
                 for kind, sum_ in disk._CHECKSUMS.items()}
    monkeypatch.setattr(disk, "_CHECKSUMS", checksums)
    return summed


def test_blocks_synced_by_a_clean_close_are_served_unchecked_and_in_place(tmp_path,
                                                                           monkeypatch):
    tier = _tier(tmp_path)
    tier.put(_block(1), b"synced" * 1000)
    tier.close()
    summed = _counting_checksums(monkeypatch)

    tier = _tier(tmp_path)
    try:
        assert not (tmp_path / "synced").exists(), "the marker outlived the open"
        assert tier.checked_file(_block(1)) is not None
        assert tier.get(_block(1)) == b"synced" * 1000
        assert summed == []
    finally:
        tier.close()


def test_after_a_crash_a_block_is_checked_once_then_served_unchecked(tmp_path, monkeypatch):
    tier = _tier(tmp_path)
    tier.put(_block(1), b"unsynced" * 1000)
    tier.close()
    _as_after_a_crash(tmp_path)
    summed = _counting_checksums(monkeypatch)

    tier = _tier(tmp_path)
    try:
        assert tier.checked_file(_block(1)) is None
        assert tier.get(_block(1)) == b"unsynced" * 1000
        assert tier.get(_block(1)) == b"unsynced" * 1000
        assert summed == [8000]
        assert tier.checked_file(_block(1)) is not None
    finally:
        tier.close()


def test_a_crash_after_a_clean_close_leaves_every_block_to_be_checked(tmp_path):
    """The marker is taken at open: blocks written by a mount that then crashes are never
    taken for synced, nor are those of the clean close before it (they look alike)."""
    tier = _tier(tmp_path)
    tier.put(_block(1), b"one" * 1000)
    tier.close()
    tier = _tier(tmp_path)
    tier.put(_block(2), b"two" * 1000)
    tier._index.close()  # what a crash leaves: the index as written, no marker
    tier._closing.set()
    tier._sweeper.join(10)
    _block_file(tmp_path, _block(2)).write_bytes(b"TWO" * 1000)

    tier = _tier(tmp_path)
    try:
        assert tier.checked_file(_block(1)) is None
        assert tier.get(_block(1)) == b"one" * 1000
        assert tier.get(_block(2)) is None, "a block torn in the crashed mount was served"
    finally:
        tier.close()


def test_a_tier_that_cannot_sync_at_close_leaves_no_marker(tmp_path, monkeypatch):
    tier = _tier(tmp_path)
    tier.put(_block(1), b"one" * 1000)

    def cannot_sync(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(disk, "_sync_file_system", cannot_sync)
    tier.close()

    assert not (tmp_path / "synced").exists()


def test_every_block_folder_is_made_when_the_tier_opens(tmp_path):
    """A block's write makes no folder (the first writes to a fresh cache dir paid for one
    each); so the tier makes them all when it opens, again where one has gone since."""
    _tier(tmp_path).close()
    folders = tmp_path / "blocks"
    assert sorted(path.name for path in folders.iterdir()) == [f"{n:02x}" for n in range(256)]
    (folders / _block(5).file_name()[:2]).rmdir()

    tier = _tier(tmp_path)
    try:
        tier.put(_block(5), b"five" * 1000)
        assert tier.get(_block(5)) == b"five" * 1000
        assert len(list(folders.iterdir())) == 256
    finally:
        tier.close()


def test_a_closed_tier_sweeps_no_more(tmp_path):
    """The next tier on the cache dir writes blocks its predecessor's sweep never indexed:
    a sweep still running after `close` would take them for a crash's leftovers."""
    _tier(tmp_path).close()
    leftover = _leave_unindexed_file(tmp_path, _block(4))
    tier = _tier(tmp_path, _GatedSweepTier)
    closer = threading.Thread(target=tier.close)
    closer.start()
    assert tier._closing.wait(10)

    tier.gate.set()
    closer.join(10)

    assert not closer.is_alive() and not tier._sweeper.is_alive()
    assert leftover.exists(), "the sweep went on after close"


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _cached(path: Path) -> bool:
    """Whether the file's first page is in the page cache, by mincore(2) of a mapping that
    is never touched: asking must not bring the page in (a read, even one that may not wait
    for the device, starts reading it ahead)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _LIBC.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of the block file failed")
        try:
            residency = ctypes.create_string_buffer(1)
            if _LIBC.mincore(address, 4096, residency) != 0:
                raise OSError(ctypes.get_errno(), "mincore of the block file failed")
            return bool(residency.raw[0] & 1)
        finally:
            _LIBC.munmap(address, 4096)
    finally:
        os.close(fd)


def _written_past_the_page_cache(path: Path, scratch: Path) -> None:
    """The file replaced by a copy of its bytes written with O_DIRECT into a new inode, of
    which no page is cached: dropping a written file's pages (`POSIX_FADV_DONTNEED`) may
    leave one that another task holds a moment longer, and on a loaded machine longer. The
    copy is written in `scratch`, outside the tier's blocks, whose sweep at start removes
    the files its index does not know."""
    data = path.read_bytes()
    copy = scratch / (path.name + ".direct")
    with mmap.mmap(-1, -(-len(data) // 4096) * 4096) as buffer:
        buffer[:len(data)] = data
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        try:
            os.write(fd, buffer)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
    os.replace(copy, path)


def test_a_block_expected_to_be_read_is_brought_into_the_page_cache(tmp_path):
    tier = _tier(tmp_path)
    block = _block(3)
    tier.put(block, os.urandom(100 * 1024))
    path = tmp_path / tier.checked_file(block)
    _written_past_the_page_cache(path, tmp_path)
    assert not _cached(path), ("the test's directory is on a file system that caches what "
                               "is written with O_DIRECT (tmpfs?): run it where the cache "
                               "dir would be, on a disk")

    tier.expect_read(block)

    deadline = time.monotonic() + 5
    while not _cached(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _cached(path)
    tier.close()


def test_expecting_a_read_of_a_block_not_held_or_gone_does_nothing(tmp_path):
    tier = _tier(tmp_path)
    tier.expect_read(_block(1))
    tier.put(_block(2), b"x" * 4096)
    (tmp_path / tier.checked_file(_block(2))).unlink()

    tier.expect_read(_block(2))

    assert tier.get(_block(2)) is None, "the gone file is found damaged when read, as before"
    tier.close()


def test_a_block_file_that_cannot_be_opened_is_left_to_the_read(tmp_path, monkeypatch):
    """The hint runs in an OPEN on the FUSE loop: an error opening the block file (here, no
    descriptors left) must not fail that OPEN."""
    tier = _tier(tmp_path)
    data = b"y" * 4096
    tier.put(_block(4), data)
    real_open = os.open

    def out_of_descriptors(path, flags, *args):
        if str(path).endswith(_block(4).file_name()):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", out_of_descriptors)
    tier.expect_read(_block(4))
    monkeypatch.undo()

    assert tier.get(_block(4)) == data
    tier.close()


def test_an_adopted_file_is_moved_into_place_and_kept_across_a_reopen(tmp_path):
    tier = _tier(tmp_path / "tier")
    written = tmp_path / "written"
    written.write_bytes(b"written through the mount")
    assert tier.adopt(_block(0), written, len(b"written through the mount"))
    assert not written.exists()
    assert tier.get(_block(0)) == b"written through the mount"
    tier.close()
    reopened = _tier(tmp_path / "tier")
    assert reopened.get(_block(0)) == b"written through the mount"
    reopened.close()


def test_a_file_not_taken_is_left_where_it_is(tmp_path):
    tier = _tier(tmp_path / "tier")
    tier.put(_block(1), b"cached already")
    held = tmp_path / "held"
    held.write_bytes(b"same block, other bytes")
    assert not tier.adopt(_block(1), held, len(b"same block, other bytes"))
    grown = tmp_path / "grown"
    grown.write_bytes(b"longer than its version")
    assert not tier.adopt(_block(2), grown, 4)
    assert held.exists() and grown.exists()
    assert tier.get(_block(1)) == b"cached already"
    assert tier.get(_block(2)) is None
    tier.close()
