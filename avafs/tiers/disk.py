"""The disk tier: one file per block under the cache dir, indexed in rocksdict.

It survives unmount and crashes, so a remount starts warm. A block file is written to a
temporary name and renamed into place before it is indexed, and the index records its size and
checksum, so a block torn by a crash is detected and dropped instead of served. The checksum is
CRC-32C (`google-crc32c`, the CPU's own instruction where it has one): every block a cold read
fetches is summed once, and every block read after a crash once, so zlib's table-driven
CRC-32 was a large share of the CPU of both. Records from before carry a CRC-32 and are checked
with it. A tier closed cleanly syncs its file system and leaves a marker (`SYNCED_MARKER`): every
block it indexed is then whole on the device, so the next mount serves them unchecked. The
marker is removed, durably, before that mount writes anything, so a crash in it leaves none,
and the mount after the crash checks every block again. Which clean blocks
stay when the tier is full is its policy's choice: least recently used (`lru.py`) or, for
datasets larger than the tier, least read with admission control (`frequency.py`). Files the
index does not know (a crash between rename and index write) take disk space no cap accounts
for; a background sweep at start removes them, sparing the blocks the mount writes meanwhile,
and stops when the tier closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import google_crc32c
from rocksdict import Options, Rdict, WriteBatch

from ..objects import BlockId, allocated
from .block_files import BlockFileWriter
from .frequency import FrequencyCache
from .lru import CappedLRU, TierAccounting

log = logging.getLogger(__name__)

_RECORD = struct.Struct("<QIQIB")  # size, checksum, access sequence, reads, checksum kind
_RECORD_V2 = struct.Struct("<QIQI")
"""Records written before CRC-32C: their checksum is a CRC-32."""
_RECORD_V1 = struct.Struct("<QIQ")
"""Records written before reads were counted; such blocks come back with one read."""
CRC32 = 0
CRC32C = 1
_CHECKSUMS = {CRC32: zlib.crc32, CRC32C: google_crc32c.value}
"""Checksum kind, as recorded -> the function."""
BLOCKS_DIR = "blocks"
FOLDER_DIGITS = 2
"""Hex digits of a block file's name that name its folder: 256 folders."""
SYNCED_MARKER = "synced"
"""A file in the tier's root, there only between a clean close and the next open."""
_libc = ctypes.CDLL(None, use_errno=True)


def _sync_file_system(path: Path) -> None:
    """syncfs(2) of the file system holding `path`: the block files and the index, written
    without fsync, reach the device; other file systems are left alone, as sync(2) would not."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), str(path))
    finally:
        os.close(fd)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _take_synced_marker(root: Path) -> bool:
    """Whether the last tier on `root` closed cleanly; the marker is gone, on the device,
    when this returns, so that blocks written from now on are never taken as synced."""
    marker = root / SYNCED_MARKER
    try:
        marker.unlink()
    except FileNotFoundError:
        return False
    _fsync_directory(root)
    return True


def _read_at_most(path: str, size: int) -> bytes | None:
    """Up to `size` bytes of the file, None if it is gone: one open and one read, which the
    FUSE loop runs for every small block after a remount (`Path.read_bytes` stats the file
    and reads it through a buffered file object: several times the Python work). Asking for
    one byte more than the recorded size shows a file that grew as damaged."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _relative_path(block: BlockId) -> str:
    name = block.file_name()
    return f"{BLOCKS_DIR}/{name[:FOLDER_DIGITS]}/{name}"


def _make_folders(blocks_dir: Path) -> None:
    """Every folder a block file may go to, made once when the tier opens: a block's write
    then neither makes a directory (a new inode, on the FUSE loop for a small object's
    block) nor asks whether one exists. A folder removed under a running daemon makes the
    writes into it fail and log, as any other write error, until the next mount."""
    blocks_dir.mkdir(exist_ok=True)
    present = set(os.listdir(blocks_dir))
    for number in range(16**FOLDER_DIGITS):
        name = f"{number:0{FOLDER_DIGITS}x}"
        if name not in present:
            os.mkdir(blocks_dir / name)


class DiskTier(TierAccounting):
    name = "disk"

    def __init__(self, root: Path, capacity: int, capacity_files: int, high: float,
                 low: float, policy: str = "lru", recount_after: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`policy`: "lru", or "dataset" for reads of datasets larger than the tier
        (`frequency.py`, which counts a block's reads once per `recount_after` seconds of
        `clock`)."""
        self.root = root
        self._root = str(root)
        self._blocks_dir = root / BLOCKS_DIR
        self._tmp_dir = root / "tmp"
        shutil.rmtree(self._tmp_dir, ignore_errors=True)
        self._tmp_dir.mkdir(parents=True)
        synced = _take_synced_marker(root)
        _make_folders(self._blocks_dir)
        self._lock = threading.Lock()
        self._writer = BlockFileWriter()
        self._capacity = capacity
        self._lru = (FrequencyCache(capacity, capacity_files, high, low, capacity_files,
                                    recount_after, clock)
                     if policy == "dataset" else CappedLRU(capacity, capacity_files, high, low))
        self._records: dict[BlockId, tuple[int, int, int]] = {}  # size, checksum, its kind
        self._checked: set[BlockId] = set()
        """Blocks whose file this daemon wrote or has checked against its CRC, or that a clean
        close synced: a crash that tore a file happened before any of these, so they may be
        read without the check. A set, not a map to each file's path, which would cost about
        100 more bytes per block."""
        self._index = Rdict(str(root / "index"), options=Options(raw_mode=True))
        self._load_index()
        if synced:
            self._checked.update(self._records)
        self._written_while_sweeping: set[str] | None = set()
        """Names of block files written since the sweep took its list of indexed blocks: the
        sweep must not take them for a crash's leftovers. None once the sweep has ended."""
        self._closing = threading.Event()
        """Set by `close`: the sweep stops, so that it never takes the blocks of a tier opened
        on the same cache dir after this one for a crash's leftovers."""
        self._sweeper = threading.Thread(target=self._sweep_unindexed_files, daemon=True,
                                         name="avafs-disk-sweep")
        self._sweeper.start()

    def _load_index(self) -> None:
        records = []
        for raw_key, raw_value in self._index.items():
            if len(raw_value) == _RECORD_V1.size:
                size, crc, sequence, reads, kind = *_RECORD_V1.unpack(raw_value), 1, CRC32
            elif len(raw_value) == _RECORD_V2.size:
                size, crc, sequence, reads, kind = *_RECORD_V2.unpack(raw_value), CRC32
            else:
                size, crc, sequence, reads, kind = _RECORD.unpack(raw_value)
            records.append((sequence, BlockId.decode(raw_key.decode()), size, crc, reads, kind))
        for _, block, size, crc, reads, kind in sorted(records, key=lambda record: record[0]):
            self._lru.add(block, allocated(size), reads)
            self._records[block] = (size, crc, kind)
        if records:
            log.info("disk tier: reusing %d cached blocks (%d bytes)", len(records),
                     self._lru.used_bytes)
        self._over_cap_at_start()

    def _over_cap_at_start(self) -> None:
        """A smaller --disk-cache than last time: trim at once, not at the next insert."""
        self._remove(self._lru.victims_over_capacity())

    def _sweep_unindexed_files(self) -> None:
        with self._lock:
            known = {block.file_name() for block in self._records}
        removed = 0
        for path in self._block_files():
            if self._closing.is_set():
                break
            if path.name in known:
                continue
            with self._lock:  # held across the unlink, so a put of this name waits for it
                if path.name in self._written_while_sweeping:
                    continue
                path.unlink(missing_ok=True)
            removed += 1
        with self._lock:
            self._written_while_sweeping = None
        if removed:
            log.info("disk tier: removed %d block files left unindexed by a crash", removed)

    def _block_files(self) -> Iterator[Path]:
        for folder in self._blocks_dir.iterdir():
            yield from folder.iterdir()

    @property
    def capacity(self) -> int:
        return self._capacity

    def reserve(self, dirty_bytes: int) -> None:
        """Give `dirty_bytes` of the tier to write-back: clean blocks make room, at once."""
        with self._lock:
            self._lru.capacity_bytes = max(0, self._capacity - dirty_bytes)
            victims = self._lru.victims_over_capacity()
        self._remove(victims)

    def __contains__(self, block: BlockId) -> bool:
        return block in self._records

    def _path(self, block: BlockId) -> str:
        """The block's file, as a string: pathlib's joins cost more than the open and read
        of a small block that the FUSE loop makes after a remount."""
        return f"{self._root}/{_relative_path(block)}"

    def get(self, block: BlockId) -> bytes | None:
        """The block's bytes, None if the tier lacks it or its file is damaged (then dropped).
        A file's length is always checked; its checksum only until the block is checked."""
        with self._lock:
            record = self._records.get(block)
            if record is None:
                return None
            self._lru.touch(block)
            checked = block in self._checked
        data = _read_at_most(self._path(block), record[0] + 1)
        if data is None or len(data) != record[0] or (
                not checked and _CHECKSUMS[record[2]](data) != record[1]):
            log.warning("disk tier: dropping damaged or missing block of %s", block.key)
            self.discard([block])
            return None
        with self._lock:
            if block in self._records:
                self._checked.add(block)
        return data

    def expect_read(self, block: BlockId) -> None:
        """Start reading the block's file into the page cache, without waiting for it, if
        the tier holds it: the read that follows then finds it there, or waits only for what
        is left of the device's latency. A hint: a file that is gone or cannot be opened
        (out of descriptors, say) is left to the read, which reports what it finds, so the
        caller (an OPEN on the FUSE loop) never fails for it."""
        if block not in self._records:
            return
        try:
            fd = os.open(self._path(block), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # the read that follows goes to the device, as without the hint
        finally:
            os.close(fd)

    def checked_file(self, block: BlockId) -> str | None:
        """The block's file, relative to the tier's root, if its contents are known good
        (see `_checked`); readers on this machine may read it in place. The file is never
        rewritten with other bytes (a block names one version), but it may be evicted and
        unlinked at any time: a reader that finds it gone asks the daemon for the bytes."""
        with self._lock:
            if block not in self._checked:
                return None
            self._lru.touch(block)
        return _relative_path(block)

    def touch(self, block: BlockId) -> bool:
        """Whether the tier holds the block; a held one counts as read (a reader said it will
        read it soon, and may do so in place, unseen)."""
        with self._lock:
            return block in self._records and self._lru.touch(block)

    def put(self, block: BlockId, data: bytes, read: bool = True) -> None:
        """Offers a block to the tier; `read` is False for a block that no read brought here
        (demoted from RAM), which the policy must not count as read again."""
        path = self._path(block)
        if not self._admit(block, allocated(len(data)), read):
            return
        tmp = f"{self._tmp_dir}/{path.rpartition('/')[2]}.{threading.get_ident()}"
        try:
            self._writer.write(tmp, data)
            os.replace(tmp, path)
        except OSError as error:
            log.error("disk tier: cannot write block of %s: %s", block.key, error)
            Path(tmp).unlink(missing_ok=True)
            with self._lock:
                self._lru.discard(block)
            return
        self._record(block, len(data), google_crc32c.value(data))

    def adopt(self, block: BlockId, path: Path, size: int) -> bool:
        """Takes the file at `path`, which holds exactly the block's `size` bytes and nobody
        writes any more, as the block's file, moving it into place; False, leaving it where
        it is, if the tier does not take it. Why: a file written through the mount is, once
        the store has it, the block of the version the store now has, and keeping it makes
        reading it back a hit without a second write of its bytes, and spares the file
        system an unlink now and a create at that read (on ext4 without a journal, every
        inode allocated soon after many unlinks scans past the recently freed ones). The
        block's checksum is taken from the file as it is moved, so the file must hold no
        other bytes than the version's."""
        if not self._admit(block, allocated(size), False):
            return False
        data = _read_at_most(str(path), size + 1)
        if data is not None and len(data) == size:
            try:
                os.replace(path, self._path(block))
            except OSError as error:  # another file system, say: the caller removes the file
                log.info("disk tier: cannot keep %s as a cached block: %s", block.key, error)
            else:
                self._record(block, size, google_crc32c.value(data))
                return True
        with self._lock:
            self._lru.discard(block)
        return False

    def _admit(self, block: BlockId, size: int, read: bool) -> bool:
        """Whether the block gets a place, making room for it and reserving it (pinned) if
        so: concurrent inserts then cannot overrun the cap together."""
        with self._lock:
            if (block in self._records or not self._lru.fits(size)
                    or not self._lru.admits(block, size, read)):
                return False
            victims = self._lru.victims_to_admit(size)
            self._forget(victims)
            self._lru.add(block, size)
            self._lru.pin(block)
            if self._written_while_sweeping is not None:
                self._written_while_sweeping.add(block.file_name())
        self._unlink(victims)
        return True

    def _record(self, block: BlockId, size: int, crc: int) -> None:
        """The admitted block's file is in place: index it, so reads and remounts find it."""
        with self._lock:
            self._lru.unpin(block)
            self._records[block] = (size, crc, CRC32C)
            self._checked.add(block)
            self._index[block.encode().encode()] = _RECORD.pack(size, crc, 0,
                                                                self._lru.reads(block), CRC32C)

    def evict_to_low_watermark(self) -> int:
        with self._lock:
            victims = self._lru.victims_to_low_watermark()
        return self._remove(victims)

    def discard(self, blocks: list[BlockId]) -> int:
        return self._remove(blocks)

    def blocks(self) -> list[BlockId]:
        with self._lock:
            return list(self._records)

    def _remove(self, victims: list[BlockId]) -> int:
        with self._lock:
            victims = [block for block in victims if block in self._records]
            self._forget(victims)
        self._unlink(victims)
        return len(victims)

    def _forget(self, victims: list[BlockId]) -> None:
        """Drop blocks from the accounting and the index; call with the lock held."""
        batch = WriteBatch(raw_mode=True)
        for victim in victims:
            self._lru.discard(victim)
            self._records.pop(victim, None)
            self._checked.discard(victim)
            batch.delete(victim.encode().encode())
        if victims:
            self._index.write(batch)

    def _unlink(self, victims: list[BlockId]) -> None:
        for victim in victims:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(victim))

    def close(self) -> None:
        """Record the LRU order and read counts, so the next mount evicts the same cold blocks
        first (a crash loses them: blocks then come back in any order, with one read each);
        then sync the tier and mark it synced (a failed sync leaves no marker: the next mount
        checks every block, as after a crash)."""
        self._closing.set()
        self._sweeper.join()
        with self._lock:
            batch = WriteBatch(raw_mode=True)
            for sequence, block in enumerate(self._lru):
                record = self._records.get(block)
                if record is not None:
                    size, crc, kind = record
                    batch.put(block.encode().encode(),
                              _RECORD.pack(size, crc, sequence, self._lru.reads(block), kind))
            self._index.write(batch)
            self._index.close()
        try:
            _sync_file_system(self.root)
            with open(self.root / SYNCED_MARKER, "wb") as marker:
                os.fsync(marker.fileno())
            _fsync_directory(self.root)
        except OSError as error:
            log.warning("disk tier: cannot sync the cache dir at close (%s); the next mount "
                        "checks every block it reads", error)
