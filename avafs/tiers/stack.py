"""TierStack: RAM tier -> disk tier -> store, for reads of byte ranges of object versions.

Readers on the FUSE loop come in through `read_async`, which picks the cheapest way to answer
(inline from RAM or, for a small object, the disk tier; a small object's one GET in a worker
thread, cached from the loop; else `read` in a worker thread) and drives the open file's
read-ahead (`readahead.py`). Readers already in a thread call `read`, or `read_whole` for a
batch of whole objects.

Every block being loaded has one future in `_loading`, whether a reader, a warmup or a
read-ahead stream started it, so concurrent readers of a block share one GET, and the global
in-flight budget (`--inflight-memory`) bounds every fetch, read-ahead included, whatever the
number of readers. The disk write of a fetched block happens after waiting readers
have their data, so it never adds to their latency; only a read of a single missing block,
which loads it in the reader's own thread or on the FUSE loop, waits for that write too (see
`read` and `_fetch_small`). A stream hands its blocks' disk writes to writer threads and goes
on reading its response (see `_write_behind`).

With a cluster tier (`--cluster-cache`, tiers/cluster.py) a block no local tier holds is
looked for there before the store, and a block read from the store is handed to it to fill;
both happen only where a block is fetched (`_load`, `_stream`), so the local paths above it
are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from ..errors import AvafsError, StoreError
from ..metrics import Metrics
from ..objects import BlockId, ObjectRef, block_span
from .cluster import ClusterTier
from .disk import DiskTier
from .ram import RamTier
from .readahead import ReadAhead

log = logging.getLogger(__name__)

INLINE_DISK_READ = 512 * 1024
"""Objects this small are read from the disk tier in the caller's thread: reading and checking
one small block costs less than the two thread hops of a load (request thread, fetch pool),
which were most of a small file's read after a remount. The FUSE request loop waits for that
read, so the bound keeps it well under a millisecond from the page cache or an SSD."""

WRITE_BEHIND_BLOCKS = 8
"""Blocks a stream may have fetched and not yet written to the disk tier; a stream that gets
this far ahead of the disk waits for it, so the bytes held for writing stay bounded."""

CLUSTER_PIECE = 4
"""Blocks of a stream looked up in the cluster tier (their GETs side by side, then a
conditional PUT and a GET for each missing one) before the ones this node claimed are read
from the store in one request."""

RELEASE_BEHIND = WRITE_BEHIND_BLOCKS + 2
"""Blocks before a sequential reader's previous block that each of its reads offers to
release from RAM: its previous block stays (the kernel sends a file's READs several at a
time, not always in order), and a block whose disk write was still behind the stream when
the reader passed it is offered again while the stream's write-behind (at most
WRITE_BEHIND_BLOCKS) catches up."""

STREAM_PIECE = 8 * 2**20
"""Bytes of a stream's run of missing blocks asked for in one GET (at least one block): the
pieces of a run go side by side, each on a connection and a fetch slot of its own."""

WRITE_BEHIND_THREADS = 2
"""Disk writes of streamed blocks at a time: a block of 1 MiB or more is a direct write (see
`block_files`) that keeps the device busy for milliseconds and the CPU for little, so two keep
a disk busy without taking the cores."""


class Space(NamedTuple):
    """What the mount can hold, as `statfs` reports it: the disk tier's bytes and files."""

    total_bytes: int
    free_bytes: int
    total_files: int
    free_files: int


class TierStack:
    def __init__(self, ram: RamTier, disk: DiskTier, block_size: int, inflight_memory: int,
                 metrics: Metrics, read_ahead: int, cluster: ClusterTier | None = None,
                 stream_piece: int = STREAM_PIECE) -> None:
        """`read_ahead`: blocks the first read-ahead stream of an open file asks for;
        `cluster`: the shared tier between the disk tier and the store, if any;
        `stream_piece`: bytes of a stream asked for in one GET (STREAM_PIECE)."""
        self.ram = ram
        self.disk = disk
        self.cluster = cluster
        self.block_size = block_size
        self.metrics = metrics
        self._read_ahead = read_ahead
        self._piece_blocks = max(1, stream_piece // block_size,
                                 0 if cluster is None else CLUSTER_PIECE)
        """Blocks of a stream's piece: with a cluster tier, at least the blocks whose lookups
        in it go side by side (CLUSTER_PIECE), which a smaller piece would leave idle."""
        slots = max(1, inflight_memory // block_size)
        self._slots = threading.BoundedSemaphore(slots)
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="avafs-fetch")
        self._writers = ThreadPoolExecutor(max_workers=WRITE_BEHIND_THREADS,
                                           thread_name_prefix="avafs-disk-write")
        self._write_behind_room = threading.BoundedSemaphore(WRITE_BEHIND_BLOCKS)
        self._loading: dict[BlockId, Future[bytes]] = {}
        self._lock = threading.Lock()
        self._wake_evictor = threading.Event()
        self._closed = False
        self._evictor = threading.Thread(target=self._evict_in_background, daemon=True,
                                         name="avafs-evictor")
        self._evictor.start()

    def block_count(self, ref: ObjectRef) -> int:
        return -(-ref.size // self.block_size)

    def space(self, dirty_bytes: int) -> Space:
        """The disk tier's capacity and what is free of it, `dirty_bytes` (written data not
        yet uploaded, kept in the same cache dir) counted as used."""
        free = max(0, self.disk.capacity - self.disk.used - dirty_bytes)
        files = self.disk.capacity_files
        return Space(self.disk.capacity, free, files, max(0, files - len(self.disk)))

    def new_read_ahead(self) -> ReadAhead:
        """The read-ahead state of a newly opened file (or a reopened version of one)."""
        return ReadAhead(self._read_ahead)

    async def read_async(self, ref: ObjectRef, offset: int, size: int, read_ahead: ReadAhead,
                         threads: Executor) -> bytes:
        """The bytes of [offset, offset+size), for a reader on an asyncio loop (the FUSE
        request loop) that keeps `read_ahead` per open file. The cheapest way that can answer is
        taken, in this order:

        1. an object of one small block (INLINE_DISK_READ) in RAM or the disk tier: read
           here, on the loop;
        2. such an object in neither tier: its one GET from the loop where the store can
           send it so (`get_range_async`), else in a worker thread, the rest on the loop
           (`_fetch_small`);
        3. a larger object first takes its reader's read-ahead into account, which may start
           a stream (never blocks); then every block in RAM: sliced here, on the loop;
        4. anything else: `read` in one of the caller's `threads` (its pool for every
           request that may block).

        A thread hop costs more than an answer already in memory, so 1 and 3 take none."""
        data = self._read_small(ref, offset, size)
        if data is None and self._is_small(ref):
            data = await self._fetch_small(ref, offset, size)
        if data is not None:
            return data
        span = block_span(offset, size, ref.size, self.block_size)
        if ref.size > self.block_size and span:  # a one-block object is loaded by `read`
            wanted = read_ahead.next_stream(span, self.block_count(ref))
            if wanted is not None:
                read_ahead.streamed(wanted, self.stream(ref, wanted.start, len(wanted)))
        data = self._read_from_ram(ref, offset, size)
        if data is None:
            data = await asyncio.get_running_loop().run_in_executor(threads, self.read, ref,
                                                                    offset, size)
        if span.start > 1 and self._reaches_a_block_start(offset, size):
            self._release(ref, range(max(0, span.start - RELEASE_BEHIND), span.start - 1))
        return data

    def _reaches_a_block_start(self, offset: int, size: int) -> bool:
        """Whether [offset, offset+size) holds the first byte of a block: a sequential reader
        offers the blocks behind it for release once per block it enters, not on each of the
        READs it reads a block in."""
        return -(-offset // self.block_size) * self.block_size < offset + size

    def read_whole(self, refs: list[ObjectRef]) -> list[bytes | AvafsError | OSError]:
        """Each object's bytes, or the error (the store's or the disk's) reading it gave, for
        a batch of whole-file readers in one thread (blocks the caller). Objects all in RAM
        are taken first, before the loads of the others can evict them; every other object
        then starts streaming at once, and the disk tier's files of the small ones start
        being read (`expect_read`), so the batch waits for its slowest object, not for the
        sum of them."""
        results: list[bytes | AvafsError | OSError | None] = [
            self._read_from_ram(ref, 0, ref.size) if ref.size else b"" for ref in refs]
        for ref, result in zip(refs, results, strict=True):
            if result is None:
                self.expect_read(ref)
                self.stream(ref, 0, self.block_count(ref))
        for position, ref in enumerate(refs):
            if results[position] is None:
                try:
                    results[position] = self.read(ref, 0, ref.size)
                except (AvafsError, OSError) as error:
                    results[position] = error
                self._release(ref, range(self.block_count(ref)))
        return results

    def _release(self, ref: ObjectRef, indices: range) -> None:
        """Its reader has gone past these blocks: those a stream brought into RAM leave it,
        if the disk tier holds them (see `RamTier.release`). One the disk tier has not taken
        yet (its write behind the stream still to come) stays, as under the tier's own
        policy."""
        done = [block for index in indices if (block := ref.block(index)) in self.disk]
        if done:
            self.ram.release(done)

    def _read_from_ram(self, ref: ObjectRef, offset: int, size: int) -> bytes | None:
        """The bytes if every block is in RAM, without blocking; else None."""
        parts = []
        for index in block_span(offset, size, ref.size, self.block_size):
            data = self.ram.get(ref.block(index))
            if data is None:
                return None
            parts.append(data)
        result = self._slice(parts, offset, size, ref)
        self.metrics.tier_hits["ram"].inc(len(parts))
        self.metrics.served_from["ram"].inc(len(result))
        return result

    def _is_small(self, ref: ObjectRef) -> bool:
        """One block, small enough to read or write on the FUSE loop (INLINE_DISK_READ)."""
        return ref.size <= min(INLINE_DISK_READ, self.block_size)

    def _read_small(self, ref: ObjectRef, offset: int, size: int) -> bytes | None:
        """The bytes of an object of one small block, from RAM or straight from the disk
        tier; None if it is larger, loading, or in neither tier (never waits for the store).

        Such a block is read from the disk tier, not copied into RAM as well, and once the
        disk tier holds it a fetch leaves it out of RAM too (`_fetched`): its file was
        written through the page cache (it is under DIRECT_MIN_SIZE), which keeps it in
        memory while the kernel can, and the FUSE page cache holds the same bytes. A copy in
        RAM would be a third, and while the RAM tier grows every block it keeps is fresh
        memory, which the kernel must find and clear first (docs/optimization-history.md,
        "Small objects out of the RAM tier"). A warmup or prefetch into RAM still puts it there (`load`)."""
        if not self._is_small(ref):
            return None
        data = self._read_from_ram(ref, offset, size)
        if data is not None:
            return data
        block = ref.block(0)
        if block in self._loading:
            return None
        data = self.disk.get(block)
        if data is None:
            return None
        self.metrics.tier_hits["disk"].inc()
        self.metrics.served_from["disk"].inc(len(data))
        return self._slice([data], offset, size, ref)

    def expect_read(self, ref: ObjectRef) -> None:
        """The object is about to be read from the daemon (an OPEN whose pages the kernel
        does not hold, or a batch of whole-file reads): an object of one small block that
        the disk tier holds starts being read from the device now, so that readers of
        several such files wait for the device side by side rather than one after another
        (on the FUSE loop, where `_read_small` reads them, or in the batch's thread)."""
        if self._is_small(ref) and (block := ref.block(0)) not in self.ram \
                and block not in self._loading:
            self.disk.expect_read(block)

    async def _fetch_small(self, ref: ObjectRef, offset: int, size: int) -> bytes | None:
        """The bytes of a one-block object that neither tier holds (`_read_small` said None):
        the GET is the store's `get_range_async` (sent from the loop itself where the store
        can, else from a fetch thread), and the block is cached from the caller's loop,
        which costs less than the whole of `read` in a thread (docs/optimization-history.md,
        "The layout step"). None when the block got cached or began loading meanwhile, or no fetch
        slot is free: then `read`, in a thread, waits for it. The block stays small
        (INLINE_DISK_READ) because its disk write happens on the loop. With a cluster tier,
        whose requests block, None: `read` looks there first, in a thread."""
        if not self._is_small(ref) or self.cluster is not None:
            return None
        block = ref.block(0)
        if not self._slots.acquire(blocking=False):
            return None
        with self._lock:
            if self._present(block):
                self._slots.release()
                return None
            future: Future[bytes] = Future()
            self._loading[block] = future
        try:
            # The fetch pool has a thread for every slot, so this GET, which holds one, is
            # never queued behind work waiting for it where it runs in the pool.
            data = await ref.store.get_range_async(ref.key, 0, ref.size, ref.etag,
                                                   self._executor)
            self._fetched(ref, block, future, data)
        except BaseException as error:
            # Readers waiting in threads get a plain error, never the loop's CancelledError.
            if not future.done():
                future.set_exception(error if isinstance(error, Exception) else
                                     StoreError(f"reading {ref.key} was interrupted"))
            self._done_loading(block)
            raise
        finally:
            self._slots.release()
        return self._slice([data], offset, size, ref)

    def checked_files(self, refs: list[ObjectRef]) -> list[str | None]:
        """For each one-block object whose bytes the disk tier holds known good, its file
        relative to the tier's root, for a reader on this machine to read in place; else
        None. Counted as disk hits, once per call (the batched reads' hot path)."""
        files = [self.disk.checked_file(ref.block(0)) if 0 < ref.size <= self.block_size
                 else None for ref in refs]
        sizes = [ref.size for ref, file in zip(refs, files, strict=True) if file is not None]
        if sizes:
            self.metrics.tier_hits["disk"].inc(len(sizes))
            self.metrics.served_from["disk"].inc(sum(sizes))
        return files

    def read(self, ref: ObjectRef, offset: int, size: int) -> bytes:
        """The bytes of [offset, offset+size), loading blocks as needed (blocks the caller).

        `bytes_served` counts what readers get from RAM, and what loads bring from the disk
        tier or the store (whole blocks, as they are fetched).

        A read that misses a single block (a small file, a random read) loads it in this
        thread instead of handing it to the fetch pool and waiting: the hand-off and the
        wake-up cost more CPU than the disk write this thread then waits for (see
        docs/optimization-history.md, "Reads")."""
        parts: list[bytes | Future[bytes]] = []
        from_ram = 0
        span = block_span(offset, size, ref.size, self.block_size)
        for index in span:
            data = self.ram.get(ref.block(index))
            if data is not None:
                self.metrics.tier_hits["ram"].inc()
                start = index * self.block_size
                from_ram += min(offset + size, start + len(data)) - max(offset, start)
                parts.append(data)
            else:
                parts.append(self._block_future(ref, index, wait_for_slot=True,
                                                inline=len(span) == 1))
        self.metrics.served_from["ram"].inc(from_ram)
        resolved = [part if isinstance(part, bytes) else part.result() for part in parts]
        return self._slice(resolved, offset, size, ref)

    def _slice(self, parts: list[bytes], offset: int, size: int, ref: ObjectRef) -> bytes:
        start = offset - (offset // self.block_size) * self.block_size
        end = start + min(size, ref.size - offset)
        if len(parts) == 1:
            return parts[0][start:end]
        # A read across a block boundary copies only its own bytes of each block, not the
        # whole blocks joined first.
        pieces: list[memoryview] = []
        for part in parts:
            if start < len(part) and end > 0:
                pieces.append(memoryview(part)[max(start, 0):min(end, len(part))])
            start, end = start - len(part), end - len(part)
        return b"".join(pieces)

    def stream(self, ref: ObjectRef, first: int, count: int) -> int:
        """Bring the blocks of [first, first+count) towards RAM without blocking: blocks only
        on the disk tier are promoted one by one, and the first run of blocks no tier has
        is streamed in pieces of STREAM_PIECE bytes, a GET each, side by side. Returns the
        index up to which blocks are now in RAM or loading (the caller's read-ahead
        frontier); it stops at the first block for which no fetch slot was free.

        Why pieces: a sequential reader needs every block anyway, and a request per piece
        rather than per block keeps a request's latency (and price) off most blocks; some
        servers also pay per request in proportion to the object's size (they read the
        whole object for every range). Pieces side by side rather than one request for the
        run: a store that serves each connection at a bounded rate, as cloud object stores
        do, gives one reader several connections' worth, and a window that doubles (see
        `readahead.py`) puts more pieces in flight the longer a reader stays sequential."""
        last = min(first + count, self.block_count(ref))
        index = first
        while index < last:
            block = ref.block(index)
            if block in self.ram or block in self._loading:
                index += 1
            elif block in self.disk:
                # A small object's block stays on disk, where its reader reads it (see
                # `_read_small`): promoting it would only read it twice.
                if not self._is_small(ref) and self._block_future(
                        ref, index, wait_for_slot=False, transient=True) is None:
                    return index
                index += 1
            else:
                return self._start_stream(ref, index, last)
        return index

    def _start_stream(self, ref: ObjectRef, index: int, last: int) -> int:
        """Streams the run of missing blocks from `index` on, up to `last` or the first
        block present, a piece per fetch slot; returns where it stopped."""
        while index < last:
            if not self._slots.acquire(blocking=False):
                return index
            run: list[tuple[BlockId, Future[bytes]]] = []
            with self._lock:
                while index < last and len(run) < self._piece_blocks \
                        and not self._present(block := ref.block(index)):
                    future: Future[bytes] = Future()
                    self._loading[block] = future
                    run.append((block, future))
                    index += 1
            if not run:
                self._slots.release()
                return index
            self._executor.submit(self._stream, ref, run)
            if len(run) < self._piece_blocks:
                return index
        return index

    def _present(self, block: BlockId) -> bool:
        return block in self.ram or block in self._loading or block in self.disk

    def _stream(self, ref: ObjectRef, run: list[tuple[BlockId, Future[bytes]]]) -> None:
        try:
            if self.cluster is None:
                self._stream_from_store(ref, run)
            else:
                self._stream_through_cluster(ref, self.cluster, run)
        finally:
            self._slots.release()

    def _stream_through_cluster(self, ref: ObjectRef, cluster: ClusterTier,
                                run: list[tuple[BlockId, Future[bytes]]]) -> None:
        """Blocks the cluster tier holds come from it; those this node claims are streamed
        from the store, a request per unbroken stretch of a piece of CLUSTER_PIECE blocks;
        then those other nodes claimed are waited for (in this order, so that nodes never
        wait on each other, see cluster.py). Pieces, not the whole run: the reader of the
        run's first block waits for the lookups of its piece only."""
        others: list[tuple[BlockId, Future[bytes]]] = []
        for first in range(0, len(run), CLUSTER_PIECE):
            mine: list[tuple[BlockId, Future[bytes]]] = []
            piece = run[first:first + CLUSTER_PIECE]
            found = cluster.get_all([(block, self.block_length(ref, block.index))
                                     for block, _ in piece])
            for (block, future), data in zip(piece, found, strict=True):
                claimed = False
                if data is None:
                    data, claimed = cluster.claim_missing(block,
                                                          self.block_length(ref, block.index))
                if data is not None:
                    self._fetched(ref, block, future, data, write_behind=True,
                                  source="cluster", transient=True)
                else:
                    (mine if claimed else others).append((block, future))
            for stretch in _unbroken(mine):
                self._stream_from_store(ref, stretch)
            for block, future in mine:
                if future.exception() is not None:
                    cluster.release(block)
        for block, future in others:
            try:
                data = cluster.wait_for(block, self.block_length(ref, block.index))
                source = "cluster"
                if data is None:
                    data = self._get_block(ref, block.index)
                    source = "store"
            except Exception as problem:  # noqa: BLE001 - delivered to waiting readers
                future.set_exception(problem)
                self._done_loading(block)
                continue
            self._fetched(ref, block, future, data, write_behind=True, source=source,
                          transient=True)

    def block_length(self, ref: ObjectRef, index: int) -> int:
        """Bytes of block `index` of `ref`: a block's size, less for an object's last one."""
        return min(self.block_size, ref.size - index * self.block_size)

    def _get_block(self, ref: ObjectRef, index: int) -> bytes:
        return ref.store.get_range(ref.key, index * self.block_size,
                                   self.block_length(ref, index), ref.etag)

    def _stream_from_store(self, ref: ObjectRef,
                           run: list[tuple[BlockId, Future[bytes]]]) -> None:
        start = run[0][0].index * self.block_size
        end = min((run[-1][0].index + 1) * self.block_size, ref.size)
        delivered = 0
        try:
            with contextlib.closing(ref.store.open_range(ref.key, start, end - start,
                                                         ref.etag)) as body:
                for block, future in run:
                    data = _read_exactly(body, min(self.block_size,
                                                   ref.size - block.index * self.block_size))
                    self._fetched(ref, block, future, data, write_behind=True, transient=True)
                    delivered += 1
        except Exception as error:  # noqa: BLE001 - the rest is fetched block by block
            if delivered < len(run):
                log.warning("streaming %s failed after %d of %d blocks (%s); fetching the rest "
                            "block by block", ref.key, delivered, len(run), error)
            for block, future in run[delivered:]:
                try:
                    data = self._get_block(ref, block.index)
                except Exception as problem:  # noqa: BLE001 - delivered to waiting readers
                    future.set_exception(problem)
                    self._done_loading(block)
                    continue
                self._fetched(ref, block, future, data, transient=True)

    def _fetched(self, ref: ObjectRef, block: BlockId, future: Future[bytes], data: bytes,
                 to_ram: bool = True, write_behind: bool = False, source: str = "store",
                 transient: bool = False) -> None:
        """A block arrived from the store (or the cluster tier, `source`): readers first,
        then the disk tier; a load for the disk tier alone is done only once the block is
        there. A block from the store is handed to the cluster tier to fill. A small
        object's block, which readers take from the disk tier, goes into RAM only if the
        disk tier refuses it (see `_read_small`); it is written here, not behind: a small
        write, done before the block leaves `_loading`, so readers always find it in
        `_loading`, RAM or the disk tier. `transient`: a stream fetched it for its reader
        (see `RamTier`)."""
        self.metrics.served_from[source].inc(len(data))
        if source == "store":
            self.metrics.misses.inc()
            if self.cluster is not None:
                self.cluster.fill(block, data)
        if not to_ram:
            self._to_disk(block, data)
            future.set_result(data)
            return
        if self._is_small(ref):
            future.set_result(data)
            self._to_disk(block, data, ram_unless_on_disk=True)
            return
        self._admit_to_ram(block, data, transient)
        future.set_result(data)
        if write_behind:
            self._write_behind_room.acquire()
            self._writers.submit(self._write_behind, block, data)
        else:
            self._to_disk(block, data)

    def _write_behind(self, block: BlockId, data: bytes) -> None:
        """Why streams do not write their blocks themselves: a stream's thread that stops
        reading its response for every disk write leaves the connection idle for as long as
        the write takes, which can be longer than reading the block."""
        try:
            self._to_disk(block, data)
        except Exception:  # noqa: BLE001 - a cache write; the block stays readable from RAM
            log.exception("disk tier: writing a block of %s failed", block.key)
            self._done_loading(block)
        finally:
            self._write_behind_room.release()

    def _to_disk(self, block: BlockId, data: bytes, ram_unless_on_disk: bool = False) -> None:
        self.disk.put(block, data)
        if ram_unless_on_disk and block not in self.disk:
            self._admit_to_ram(block, data)
        # Only now, when a tier can serve it, may the block stop being findable as loading.
        self._done_loading(block)
        self._note_usage()

    def _done_loading(self, block: BlockId) -> None:
        with self._lock:
            self._loading.pop(block, None)

    def keep_written(self, ref: ObjectRef, path: Path) -> bool:
        """Whether the disk tier took the file at `path`, which holds exactly the version
        `ref` (a written file, once the store has it), as its cached copy (`DiskTier.adopt`).
        Only a file of one block is taken: a larger one would have to be copied into its
        blocks, a second write of every byte, for reads that may never come."""
        if not 0 < ref.size <= self.block_size:
            return False
        return self.disk.adopt(ref.block(0), path, ref.size)

    def is_cached(self, ref: ObjectRef, index: int, tier: str) -> bool:
        """Whether a block is already in `tier` ("ram", or "disk", where RAM counts too, or
        "cluster", which is asked)."""
        block = ref.block(index)
        if tier == "cluster":
            return self.cluster is not None and \
                self.cluster.holds(block, self.block_length(ref, index))
        return block in self.ram or (tier == "disk" and block in self.disk)

    def load_to_cluster(self, ref: ObjectRef, index: int) -> None:
        """Put one block into the cluster tier alone (`avafs warmup --tier cluster`), read
        from the store unless the tier holds it intact; in this thread."""
        if self.cluster is None:
            raise StoreError("this mount has no cluster tier: mount with --cluster-cache")
        block = ref.block(index)
        if self.cluster.holds(block, self.block_length(ref, index)):
            return
        data = self._get_block(ref, index)
        self.metrics.served_from["store"].inc(len(data))
        self.cluster.fill_now(block, data)

    def cached_share(self, refs: list[ObjectRef]) -> float:
        """The share of the objects' blocks that RAM or disk holds, for a reader about to read
        them: blocks the disk tier holds count as read there (see `DiskTier.touch`)."""
        blocks = [ref.block(index) for ref in refs for index in range(self.block_count(ref))]
        if not blocks:
            return 1.0
        held = sum(self.disk.touch(block) or block in self.ram for block in blocks)
        return held / len(blocks)

    def load(self, ref: ObjectRef, index: int, to_ram: bool, wait: bool = True) -> bool:
        """Bring one block into the cache for warmup and prefetch, in this thread (it waits
        for the block anyway, see `read`); False if no fetch slot was free and `wait` is
        False (such callers yield to demand reads and retry)."""
        future = self._block_future(ref, index, wait_for_slot=wait, to_ram=to_ram, inline=True)
        if future is None:
            return False
        data = future.result()
        block = ref.block(index)
        if to_ram and block in self.ram:
            self.ram.keep(block)  # it may have come in with a reader's stream
        elif to_ram:
            # Asked for in RAM, where reads leave a small object's block out (`_read_small`).
            self._admit_to_ram(block, data)
        return True

    def _block_future(self, ref: ObjectRef, index: int, wait_for_slot: bool,
                      to_ram: bool = True, inline: bool = False,
                      transient: bool = False) -> Future[bytes] | None:
        block = ref.block(index)
        data = self.ram.get(block)
        if data is not None:
            self.metrics.tier_hits["ram"].inc()
            return _done(data)
        if not to_ram and block in self.disk:
            return _done(b"")  # only load() asks for the disk tier alone, and wants no bytes
        with self._lock:
            loading = self._loading.get(block)
        if loading is not None:
            return loading
        if not self._slots.acquire(blocking=wait_for_slot):
            return None
        with self._lock:
            loading = self._loading.get(block)
            if loading is not None:
                self._slots.release()
                return loading
            future: Future[bytes] = Future()
            self._loading[block] = future
        if inline:
            self._load(ref, block, future, to_ram, transient)
        else:
            self._executor.submit(self._load, ref, block, future, to_ram, transient)
        return future

    def _load(self, ref: ObjectRef, block: BlockId, future: Future[bytes], to_ram: bool,
              transient: bool = False) -> None:
        try:
            data = self.disk.get(block)
            if data is not None:
                self.metrics.tier_hits["disk"].inc()
                self.metrics.served_from["disk"].inc(len(data))
                if not self._is_small(ref):  # see `_read_small`
                    self._admit_to_ram(block, data, transient)
                future.set_result(data)
                return
            if self.cluster is None:
                data, source = self._get_block(ref, block.index), "store"
            else:
                data, from_store = self.cluster.read_through(
                    block, self.block_length(ref, block.index),
                    lambda: self._get_block(ref, block.index))
                source = "store" if from_store else "cluster"
            # A cluster hit already cost its reader a round trip over the network: its disk
            # write goes behind the reader, as a stream's blocks do.
            self._fetched(ref, block, future, data, to_ram, write_behind=source == "cluster",
                          source=source, transient=transient)
        except BaseException as error:  # noqa: BLE001 - delivered to every waiting reader
            if not future.done():
                future.set_exception(error)
            else:
                log.error("caching block of %s failed: %s", ref.key, error)
        finally:
            with self._lock:
                self._loading.pop(block, None)
            self._slots.release()

    def _admit_to_ram(self, block: BlockId, data: bytes, transient: bool = False) -> None:
        for demoted, demoted_data in self.ram.put(block, data, transient):
            self.metrics.evictions.labels("ram").inc()
            if demoted not in self.disk:
                self.disk.put(demoted, demoted_data, read=False)
        self._note_usage()

    def _note_usage(self) -> None:
        if self.ram.above_high_watermark() or self.disk.above_high_watermark():
            self._wake_evictor.set()

    def _evict_in_background(self) -> None:
        """Keeps tiers under their high watermark so inserts rarely have to evict inline."""
        while not self._closed:
            self._wake_evictor.wait(timeout=1.0)
            self._wake_evictor.clear()
            if self.ram.above_high_watermark():
                demoted = self.ram.evict_to_low_watermark()
                self.metrics.evictions.labels("ram").inc(len(demoted))
                for block, data in demoted:
                    if block not in self.disk:
                        self.disk.put(block, data, read=False)
            if self.disk.above_high_watermark():
                self.metrics.evictions.labels("disk").inc(self.disk.evict_to_low_watermark())

    def close(self) -> None:
        self._closed = True
        self._wake_evictor.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._writers.shutdown(wait=True)
        self._evictor.join(timeout=5)
        if self.cluster is not None:
            self.cluster.close()
        self.disk.close()

    def evict(self, source: str, key: str) -> int:
        """Drop every cached block of every version of an object; returns how many."""
        ram = [block for block in self.ram.blocks() if block.source == source and block.key == key]
        disk = [block for block in self.disk.blocks()
                if block.source == source and block.key == key]
        return self.ram.discard(ram) + self.disk.discard(disk)


def _done(data: bytes) -> Future[bytes]:
    future: Future[bytes] = Future()
    future.set_result(data)
    return future


def _unbroken(run: list[tuple[BlockId, Future[bytes]]]
              ) -> list[list[tuple[BlockId, Future[bytes]]]]:
    """The run cut where its block indices skip."""
    stretches: list[list[tuple[BlockId, Future[bytes]]]] = []
    for entry in run:
        if stretches and stretches[-1][-1][0].index + 1 == entry[0].index:
            stretches[-1].append(entry)
        else:
            stretches.append([entry])
    return stretches


def _read_exactly(body, length: int) -> bytes:
    parts = []
    remaining = length
    while remaining:
        chunk = body.read(remaining)
        if not chunk:
            raise EOFError(f"stream ended {remaining} bytes early")
        parts.append(chunk)
        remaining -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)
