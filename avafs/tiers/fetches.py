"""Fetches: the blocks being loaded, whoever asked for them, and where a fetched block goes.

Every block being loaded has one future in `_loading`, whether a reader, a warmup or a
read-ahead stream started it, so concurrent readers of a block share one GET, and the global
in-flight budget (`--inflight-memory`, the fetch slots) bounds every fetch, read-ahead
included, whatever the number of readers. The disk write of a fetched block happens after
waiting readers have their data, so it never adds to their latency; only a read of a single
missing block, which loads it in the reader's own thread or on the FUSE loop, waits for that
write too (see `TierStack.read` and `TierStack._fetch_small`). A stream hands its blocks' disk
writes to writer threads and goes on reading its response (`write_behind.py`).

A block stays in `_loading` until a tier can serve it, so two readers never fetch it twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from ..metrics import Metrics
from ..objects import BlockId, ObjectRef
from .cluster import ClusterTier
from .disk import DiskTier
from .evictor import Evictor
from .ram import RamTier
from .slots import FetchSlots
from .write_behind import WriteBehind

log = logging.getLogger(__name__)

INLINE_DISK_READ = 512 * 1024
"""Objects this small are read from the disk tier in the caller's thread: reading and checking
one small block costs less than the two thread hops of a load (request thread, fetch pool),
which were most of a small file's read after a remount. The FUSE request loop waits for that
read, so the bound keeps it well under a millisecond from the page cache or an SSD."""


class Fetches:
    def __init__(self, ram: RamTier, disk: DiskTier, cluster: ClusterTier | None,
                 block_size: int, inflight_memory: int, metrics: Metrics,
                 evictor: Evictor) -> None:
        self.ram = ram
        self.disk = disk
        self.cluster = cluster
        self.block_size = block_size
        self.metrics = metrics
        self._evictor = evictor
        slots = max(1, inflight_memory // block_size)
        self.slots = FetchSlots(slots)
        """Fetch slots: `--inflight-memory / --block-size` loads or streams at once."""
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="avafs-fetch")
        """The fetch pool: a thread for every slot, so work holding a slot never queues."""
        self._write_behind = WriteBehind(self.to_disk, self.done_loading)
        self._loading: dict[BlockId, Future[bytes]] = {}
        self._lock = threading.Lock()

    def is_small(self, ref: ObjectRef) -> bool:
        """One block, small enough to read or write on the FUSE loop (INLINE_DISK_READ)."""
        return ref.size <= min(INLINE_DISK_READ, self.block_size)

    def block_count(self, ref: ObjectRef) -> int:
        return -(-ref.size // self.block_size)

    def block_length(self, ref: ObjectRef, index: int) -> int:
        """Bytes of block `index` of `ref`: a block's size, less for an object's last one."""
        return min(self.block_size, ref.size - index * self.block_size)

    def get_block(self, ref: ObjectRef, index: int) -> bytes:
        return ref.store.get_range(ref.key, index * self.block_size,
                                   self.block_length(ref, index), ref.etag)

    def __contains__(self, block: BlockId) -> bool:
        """Whether the block is being loaded (no lock: a lookup in a dict)."""
        return block in self._loading

    def loading(self, block: BlockId) -> Future[bytes] | None:
        """The future of the block's load under way, if any (no lock: a lookup in a dict)."""
        return self._loading.get(block)

    def present(self, block: BlockId) -> bool:
        return block in self.ram or block in self._loading or block in self.disk

    def claim_run(self, blocks: Iterable[BlockId], most: int
                  ) -> list[tuple[BlockId, Future[bytes]]]:
        """Claims the blocks in turn, a future each that the caller must settle, up to `most`
        and stopping at the first one present (`present`), all under one hold of the lock:
        whoever fetches a claimed block is the only one to."""
        run: list[tuple[BlockId, Future[bytes]]] = []
        with self._lock:
            for block in blocks:
                if len(run) >= most or self.present(block):
                    break
                future: Future[bytes] = Future()
                self._loading[block] = future
                run.append((block, future))
        return run

    def done_loading(self, block: BlockId) -> None:
        with self._lock:
            self._loading.pop(block, None)

    def block_future(self, ref: ObjectRef, index: int, wait_for_slot: bool,
                     to_ram: bool = True, inline: bool = False,
                     transient: bool = False) -> Future[bytes] | None:
        """The future of block `index`: done at once if RAM has it, the one of its load under
        way, else of a load started here (in this thread if `inline`, else in the fetch
        pool); None if no fetch slot was free and `wait_for_slot` is False."""
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
        if not self.slots.acquire(blocking=wait_for_slot):
            return None
        with self._lock:
            loading = self._loading.get(block)
            if loading is not None:
                self.slots.release()
                return loading
            future: Future[bytes] = Future()
            self._loading[block] = future
        if inline:
            self._load(ref, block, future, to_ram, transient)
        else:
            self.pool.submit(self._load, ref, block, future, to_ram, transient)
        return future

    def _load(self, ref: ObjectRef, block: BlockId, future: Future[bytes], to_ram: bool,
              transient: bool = False) -> None:
        try:
            data = self.disk.get(block)
            if data is not None:
                self.metrics.tier_hits["disk"].inc()
                self.metrics.served_from["disk"].inc(len(data))
                if not self.is_small(ref):  # see `TierStack._read_small`
                    self.admit_to_ram(block, data, transient)
                future.set_result(data)
                return
            if self.cluster is None:
                data, source = self.get_block(ref, block.index), "store"
            else:
                data, from_store = self.cluster.read_through(
                    block, self.block_length(ref, block.index),
                    lambda: self.get_block(ref, block.index))
                source = "store" if from_store else "cluster"
            # A cluster hit already cost its reader a round trip over the network: its disk
            # write goes behind the reader, as a stream's blocks do.
            self.fetched(ref, block, future, data, to_ram, write_behind=source == "cluster",
                         source=source, transient=transient)
        except BaseException as error:  # noqa: BLE001 - delivered to every waiting reader
            if not future.done():
                future.set_exception(error)
            else:
                log.error("caching block of %s failed: %s", ref.key, error)
        finally:
            with self._lock:
                self._loading.pop(block, None)
            self.slots.release()

    def fetched(self, ref: ObjectRef, block: BlockId, future: Future[bytes], data: bytes,
                to_ram: bool = True, write_behind: bool = False, source: str = "store",
                transient: bool = False) -> None:
        """A block arrived from the store (or the cluster tier, `source`): readers first,
        then the disk tier; a load for the disk tier alone is done only once the block is
        there. A block from the store is handed to the cluster tier to fill. A small
        object's block, which readers take from the disk tier, goes into RAM only if the
        disk tier refuses it (see `TierStack._read_small`); it is written here, not behind: a
        small write, done before the block leaves `_loading`, so readers always find it in
        `_loading`, RAM or the disk tier. `transient`: a stream fetched it for its reader
        (see `RamTier`)."""
        self.metrics.served_from[source].inc(len(data))
        if source == "store":
            self.metrics.misses.inc()
            if self.cluster is not None:
                self.cluster.fill(block, data)
        if not to_ram:
            self.to_disk(block, data)
            future.set_result(data)
            return
        if self.is_small(ref):
            future.set_result(data)
            self.to_disk(block, data, ram_unless_on_disk=True)
            return
        self.admit_to_ram(block, data, transient)
        future.set_result(data)
        if write_behind:
            self._write_behind.submit(block, data)
        else:
            self.to_disk(block, data)

    def to_disk(self, block: BlockId, data: bytes, ram_unless_on_disk: bool = False) -> None:
        self.disk.put(block, data)
        if ram_unless_on_disk and block not in self.disk:
            self.admit_to_ram(block, data)
        # Only now, when a tier can serve it, may the block stop being findable as loading.
        self.done_loading(block)
        self._evictor.note_usage()

    def admit_to_ram(self, block: BlockId, data: bytes, transient: bool = False) -> None:
        for demoted, demoted_data in self.ram.put(block, data, transient):
            self.metrics.evictions.labels("ram").inc()
            if demoted not in self.disk:
                self.disk.put(demoted, demoted_data, read=False)
        self._evictor.note_usage()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._write_behind.close()


def _done(data: bytes) -> Future[bytes]:
    future: Future[bytes] = Future()
    future.set_result(data)
    return future
