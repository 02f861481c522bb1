"""TierStack: RAM tier -> disk tier -> store, for reads of byte ranges of object versions.

Readers on the FUSE loop come in through `read_async`, which picks the cheapest way to answer
(inline from RAM or, for a small object, the disk tier; a small object's one GET in a worker
thread, cached from the loop; else `read` in a worker thread) and drives the open file's
read-ahead (`readahead.py`, whose streams are `streams.py`). Readers already in a thread call
`read`, or `read_whole` for a batch of whole objects; warmup and prefetch call `load`.

Below it: every block being loaded is one future in `Fetches` (`fetches.py`), which the fetch
slots bound and which delivers a fetched block to readers, RAM, the disk tier and the cluster
tier; disk writes behind their readers (`write_behind.py`); the evictor (`evictor.py`).

With a cluster tier (`--cluster-cache`, tiers/cluster.py) a block no local tier holds is
looked for there before the store, and a block read from the store is handed to it to fill;
both happen only where a block is fetched (`Fetches`, `Streams`), so the local paths above
it are unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import NamedTuple, TypeVar

from ..errors import AvafsError, StoreError
from ..metrics import Metrics
from ..objects import ObjectRef, block_span
from ..stores.base import ObjectInfo
from .block_file_reads import BlockFileRange, BlockFileReads
from .cluster import ClusterTier
from .disk import DiskTier
from .evictor import Evictor
from .fetches import Fetches
from .fresh import FreshBlocks
from .ram import RamTier
from .readahead import ReadAhead
from .request_loop import RequestLoop
from .streams import STREAM_PIECE, Streams
from .write_behind import WRITE_BEHIND_BLOCKS

T = TypeVar("T")
Piece = bytes | memoryview
"""What a read answers: whole blocks as bytes, a part of one block as a view of it."""

RELEASE_BEHIND = WRITE_BEHIND_BLOCKS + 2
"""Blocks before a sequential reader's previous block that each of its reads offers to
release from RAM: its previous block stays (the kernel sends a file's READs several at a
time, not always in order), and a block whose disk write was still behind the stream when
the reader passed it is offered again while the stream's write-behind (at most
WRITE_BEHIND_BLOCKS) catches up."""


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
        self._evictor = Evictor(ram, disk, metrics)
        self._fetches = Fetches(ram, disk, cluster, block_size, inflight_memory, metrics,
                                self._evictor)
        self.streams = Streams(self._fetches, stream_piece)
        """Read-ahead: `read_async` and `read_whole` start their streams through it."""
        self._file_reads = BlockFileReads(ram, disk, block_size, metrics)
        """`read_async`'s answers from the disk tier's block files, for callers that take
        file ranges."""
        self.request_loop = RequestLoop()
        """The FUSE request loop, once it serves: `read_whole` sends cold small GETs there."""
        self._fresh = FreshBlocks()

    def block_count(self, ref: ObjectRef) -> int:
        return self._fetches.block_count(ref)

    def block_length(self, ref: ObjectRef, index: int) -> int:
        """Bytes of block `index` of `ref` (`Fetches.block_length`)."""
        return self._fetches.block_length(ref, index)

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
                         threads: Executor, file_ranges: bool = False
                         ) -> Piece | BlockFileRange:
        """The bytes of [offset, offset+size), for a reader on an asyncio loop (the FUSE
        request loop) that keeps `read_ahead` per open file. The cheapest way that can answer is
        taken, in this order:

        1. an object of one small block (INLINE_DISK_READ) in RAM or the disk tier: read
           here, on the loop;
        2. such an object in neither tier: its one GET from the loop where the store can
           send it so (`get_range_async`), else in a worker thread, the rest on the loop
           (`_fetch_small`);
        3. a larger object whose blocks in the range are all in the disk tier, checked, and
           none in RAM (after a remount): for a caller that takes `file_ranges` (the kernel
           splices them from the file's page cache), a range within one block is answered
           as a `BlockFileRange`, on the loop; a range across two blocks is read from their
           files in a worker thread (`block_file_reads.py`). Neither is loaded into RAM nor
           starts a stream: the files of the blocks the stream would have asked for start
           being read instead;
        4. a larger object first takes its reader's read-ahead into account, which may start
           a stream (never blocks); then every block in RAM: sliced here, on the loop;
        5. anything else: `read` in one of the caller's `threads` (its pool for every
           request that may block).

        A thread hop costs more than an answer already in memory, so 1, 3's ranges and 4
        take none."""
        data = self._read_small(ref, offset, size)
        if data is None and self._fetches.is_small(ref):
            data = await self._fetch_small(ref, offset, size)
            if data is None:
                data = await self._loaded_small(ref, offset, size)
        if data is not None:
            return data
        span = block_span(offset, size, ref.size, self.block_size)
        files = self._file_reads.held(ref, span) if file_ranges and ref.size > self.block_size \
            else None
        if files is not None:
            wanted = read_ahead.next_stream(span, self.block_count(ref))
            if wanted is not None:
                self._file_reads.expect(ref, range(wanted.start,
                                                   min(wanted.stop, self.block_count(ref))))
                read_ahead.streamed(wanted, wanted.stop)
            end = min(offset + size, ref.size)
            if len(files) == 1:
                return self._file_reads.range(files[0], span.start, offset, end)
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(threads, self._file_reads.read, files,
                                              span.start, offset, end)
            if data is None:  # a file evicted or cut short meanwhile: load the blocks
                data = await loop.run_in_executor(threads, self.read, ref, offset, size)
            return data
        if ref.size > self.block_size and span:  # a one-block object is loaded by `read`
            wanted = read_ahead.next_stream(span, self.block_count(ref))
            if wanted is not None:
                read_ahead.streamed(wanted, self.streams.stream(ref, wanted.start, len(wanted)))
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

    def read_whole(self, refs: list[ObjectRef]) -> list[Piece | AvafsError | OSError]:
        """Each object's bytes, or the error (the store's or the disk's) reading it gave, for
        a batch of whole-file readers in one thread (blocks the caller). Objects all in RAM
        are taken first, before the loads of the others can evict them; every other object
        then starts streaming at once, and the disk tier's files of the small ones start
        being read (`expect_read`), so the batch waits for its slowest object, not for the
        sum of them. Small objects that no tier holds are first fetched from the request
        loop, side by side (`fetch_absent_small`)."""
        results: list[Piece | AvafsError | OSError | None] = [
            self._read_from_ram(ref, 0, ref.size) if ref.size else b"" for ref in refs]
        self._fetch_absent_on_loop(refs, results)
        for ref, result in zip(refs, results, strict=True):
            if result is None:
                self.expect_read(ref)
                self.streams.stream(ref, 0, self.block_count(ref))
        for position, ref in enumerate(refs):
            if results[position] is None:
                try:
                    results[position] = self.read(ref, 0, ref.size)
                except (AvafsError, OSError) as error:
                    results[position] = error
                self._release(ref, range(self.block_count(ref)))
        return results

    def _fetch_absent_on_loop(self, refs: list[ObjectRef],
                              results: list[Piece | AvafsError | OSError | None]) -> None:
        """Fills in `results` the objects of one small block that no tier holds or loads,
        fetched on the request loop where it serves (blocks the caller, a thread)."""
        if self.cluster is not None:
            return
        absent = [position for position, ref in enumerate(refs)
                  if results[position] is None and self.absent_small(ref)]
        if not absent:
            return
        fetched = self.request_loop.run(self.fetch_absent_small, [refs[p] for p in absent])
        for position, answer in zip(absent, fetched or (), strict=False):
            results[position] = answer

    def absent_small(self, ref: ObjectRef) -> bool:
        """Whether `ref` is an object of one small block that no tier holds or loads."""
        block = ref.block(0)
        return self._fetches.is_small(ref) and block not in self.disk and \
            block not in self.ram and block not in self._fetches

    async def fetch_absent_small(self, refs: list[ObjectRef]
                                 ) -> list[Piece | AvafsError | OSError | None]:
        """Each whole one-block object's bytes from its one GET sent from this loop, side by
        side, or the error that GET gave; None for one fetched elsewhere meanwhile, which the
        caller reads as before. A GET that finds every fetch slot taken waits here for one
        (`FetchSlots.acquire_async`): from this loop it costs less than the caller's in a
        thread, even a little later, and the thread would wait for a slot as well."""
        answers = await asyncio.gather(
            *(self._fetch_small(ref, 0, ref.size, wait_for_slot=True) for ref in refs),
            return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and \
                    not isinstance(answer, (AvafsError, OSError)):
                raise answer
        return answers

    def _release(self, ref: ObjectRef, indices: range) -> None:
        """Its reader has gone past these blocks: those a stream brought into RAM leave it,
        if the disk tier holds them (see `RamTier.release`). One the disk tier has not taken
        yet (its write behind the stream still to come) stays, as under the tier's own
        policy."""
        done = [block for index in indices if (block := ref.block(index)) in self.disk]
        if done:
            self.ram.release(done)

    def _read_from_ram(self, ref: ObjectRef, offset: int, size: int) -> Piece | None:
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

    def _read_small(self, ref: ObjectRef, offset: int, size: int) -> Piece | None:
        """The bytes of an object of one small block, from RAM, from what its lookup just
        fetched (`fresh.py`; counted as the disk tier's hit, which holds the same block) or
        straight from the disk tier; None if it is larger, loading, or in neither tier
        (never waits for the store).

        Such a block is read from the disk tier, not copied into RAM as well, and once the
        disk tier holds it a fetch leaves it out of RAM too (`Fetches.fetched`): its file was
        written through the page cache (it is under DIRECT_MIN_SIZE), which keeps it in
        memory while the kernel can, and the FUSE page cache holds the same bytes. A copy in
        RAM would be a third, and while the RAM tier grows every block it keeps is fresh
        memory, which the kernel must find and clear first (docs/optimization-history.md,
        "Small objects out of the RAM tier"). A warmup or prefetch into RAM still puts it there (`load`)."""
        if not self._fetches.is_small(ref):
            return None
        data = self._read_from_ram(ref, offset, size)
        if data is not None:
            return data
        block = ref.block(0)
        data = self._fresh.get(block)
        if data is None:
            if block in self._fetches:
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
        if self._fetches.is_small(ref) and (block := ref.block(0)) not in self.ram \
                and block not in self._fetches and block not in self._fresh:
            self.disk.expect_read(block)

    async def _fetch_small(self, ref: ObjectRef, offset: int, size: int,
                           wait_for_slot: bool = False) -> Piece | None:
        """The bytes of a one-block object that neither tier holds (`_read_small` said None):
        the GET is the store's `get_range_async` (sent from the loop itself where the store
        can, else from a fetch thread), and the block is cached from the caller's loop,
        which costs less than the whole of `read` in a thread (docs/optimization-history.md,
        "The layout step"). None when the block got cached or began loading meanwhile, or
        no fetch slot is free and the caller would not wait for one (`wait_for_slot`): then
        `read`, in a thread, waits for it. The block stays small (INLINE_DISK_READ) because
        its disk write happens on the loop. With a cluster tier, whose requests block, None:
        `read` looks there first, in a thread."""
        async def get() -> tuple[bytes, None]:
            return await ref.store.get_range_async(ref.key, 0, ref.size, ref.etag,
                                                   self._fetches.pool), None

        fetched = await self._fetch_alone(ref, get, wait_for_slot)
        return None if fetched is None else self._slice([fetched[0]], offset, size, ref)

    async def _loaded_small(self, ref: ObjectRef, offset: int, size: int) -> Piece | None:
        """The bytes of a one-block object whose load is under way (a fetch ahead of its
        reader, another reader's), awaited on this loop; None where no load is under way or
        it failed: `read`, in a thread, then loads the block itself."""
        loading = self._fetches.loading(ref.block(0))
        if loading is None:
            return None
        try:
            data = await asyncio.wrap_future(loading)
        except (AvafsError, OSError):
            return None
        return self._slice([data], offset, size, ref)

    async def fetch_ahead(self, ref: ObjectRef) -> bool:
        """Loads an object of one small block that no tier holds or loads (`absent_small`)
        with its one GET sent from this loop, if a fetch slot is free now; whether it did.
        For a reader expected soon (`avafs/fuse/read_ahead.py`): its READ then finds the
        block in the disk tier, or awaits this load (`_loaded_small`)."""
        return await self._fetch_small(ref, 0, ref.size) is not None

    async def fetch_described(self, listed: ObjectInfo, ref: ObjectRef) -> ObjectInfo | None:
        """The attributes of a one-block object that neither tier holds, from the GET that
        brings its bytes into the tiers (`ObjectStore.get_described_async`): a small file's
        first lookup then costs the request its first read would have sent, and that read
        is a hit. `listed` is the object as its listing showed it, the version `ref` names.
        None where `_fetch_small` would say None: the caller asks with a HEAD."""
        async def get() -> tuple[bytes, ObjectInfo]:
            return await ref.store.get_described_async(listed, self._fetches.pool)

        fetched = await self._fetch_alone(ref, get)
        if fetched is None:
            return None
        self._fresh.keep(ref.block(0), fetched[0])
        return fetched[1]

    async def _fetch_alone(self, ref: ObjectRef,
                           get: Callable[[], Awaitable[tuple[bytes, T]]],
                           wait_for_slot: bool = False) -> tuple[bytes, T] | None:
        """`get()`'s answer, its bytes (the whole of `ref`) delivered as the block's load, the
        loop's own, under a fetch slot: see `_fetch_small` for when this is None."""
        if not self._fetches.is_small(ref) or self.cluster is not None:
            return None
        block = ref.block(0)
        if wait_for_slot:
            await self._fetches.slots.acquire_async()
        elif not self._fetches.slots.acquire(blocking=False):
            return None
        claimed = self._fetches.claim_run([block], 1)
        if not claimed:
            self._fetches.slots.release()
            return None
        future = claimed[0][1]
        try:
            # The fetch pool has a thread for every slot, so this GET, which holds one, is
            # never queued behind work waiting for it where it runs in the pool.
            answer = await get()
            self._fetches.fetched(ref, block, future, answer[0])
        except BaseException as error:
            # Readers waiting in threads get a plain error, never the loop's CancelledError.
            if not future.done():
                future.set_exception(error if isinstance(error, Exception) else
                                     StoreError(f"reading {ref.key} was interrupted"))
            self._fetches.done_loading(block)
            raise
        finally:
            self._fetches.slots.release()
        return answer

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

    def read(self, ref: ObjectRef, offset: int, size: int) -> Piece:
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
                parts.append(self._fetches.block_future(ref, index, wait_for_slot=True,
                                                        inline=len(span) == 1))
        self.metrics.served_from["ram"].inc(from_ram)
        resolved = [part if isinstance(part, bytes) else part.result() for part in parts]
        return self._slice(resolved, offset, size, ref)

    def _slice(self, parts: list[bytes], offset: int, size: int, ref: ObjectRef) -> Piece:
        """The bytes of [offset, offset+size) out of the blocks `parts` that hold them: a
        whole block as it is, a part of one block as a view of it, not a copy (a FUSE READ
        of a large file answers a quarter of a block at a time, and its answer is copied
        into the kernel anyway; the view holds the block only until then)."""
        start = offset - (offset // self.block_size) * self.block_size
        end = start + min(size, ref.size - offset)
        if len(parts) == 1:
            part = parts[0]
            return part if start == 0 and end == len(part) else memoryview(part)[start:end]
        # A read across a block boundary copies only its own bytes of each block, not the
        # whole blocks joined first.
        pieces: list[memoryview] = []
        for part in parts:
            if start < len(part) and end > 0:
                pieces.append(memoryview(part)[max(start, 0):min(end, len(part))])
            start, end = start - len(part), end - len(part)
        return b"".join(pieces)

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
        data = self._fetches.get_block(ref, index)
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
        future = self._fetches.block_future(ref, index, wait_for_slot=wait, to_ram=to_ram,
                                            inline=True)
        if future is None:
            return False
        data = future.result()
        block = ref.block(index)
        if to_ram and block in self.ram:
            self.ram.keep(block)  # it may have come in with a reader's stream
        elif to_ram:
            # Asked for in RAM, where reads leave a small object's block out (`_read_small`).
            self._fetches.admit_to_ram(block, data)
        return True

    def close(self) -> None:
        self._evictor.stop()
        self._fetches.close()
        self._evictor.join()
        if self.cluster is not None:
            self.cluster.close()
        self.disk.close()

    def evict(self, source: str, key: str) -> int:
        """Drop every cached block of every version of an object; returns how many."""
        ram = [block for block in self.ram.blocks() if block.source == source and block.key == key]
        disk = [block for block in self.disk.blocks()
                if block.source == source and block.key == key]
        self._fresh.discard(source, key)
        return self.ram.discard(ram) + self.disk.discard(disk)
