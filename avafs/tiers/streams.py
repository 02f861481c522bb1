"""Streams: a sequential reader's blocks brought towards RAM ahead of it (`Streams.stream`).

Blocks only on the disk tier are promoted one by one; the first run of blocks no tier has is
asked of the store in pieces of STREAM_PIECE bytes, a ranged GET each, side by side, each
holding a fetch slot and read block by block in a fetch-pool thread: each block goes to its
waiting readers, then RAM, then the disk tier behind the stream (`write_behind.py`). With a
cluster tier (`--cluster-cache`, `cluster.py`) a stream first looks its blocks up there,
CLUSTER_PIECE at a time, and claims the missing ones before it asks the store for them.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future

from ..errors import SnapshotVersionGone
from ..objects import BlockId, ObjectRef
from .cluster import ClusterTier
from .fetches import Fetches

log = logging.getLogger(__name__)

STREAM_PIECE = 8 * 2**20
"""Bytes of a stream's run of missing blocks asked for in one GET (at least one block): the
pieces of a run go side by side, each on a connection and a fetch slot of its own."""

CLUSTER_PIECE = 4
"""Blocks of a stream looked up in the cluster tier (their GETs side by side, then a
conditional PUT and a GET for each missing one) before the ones this node claimed are read
from the store in one request."""


class Streams:
    def __init__(self, fetches: Fetches, stream_piece: int = STREAM_PIECE) -> None:
        """`stream_piece`: bytes of a stream asked for in one GET (STREAM_PIECE)."""
        self._fetches = fetches
        self.ram = fetches.ram
        self.disk = fetches.disk
        self.cluster = fetches.cluster
        self.block_size = fetches.block_size
        self._piece_blocks = max(1, stream_piece // self.block_size,
                                 0 if self.cluster is None else CLUSTER_PIECE)
        """Blocks of a stream's piece: with a cluster tier, at least the blocks whose lookups
        in it go side by side (CLUSTER_PIECE), which a smaller piece would leave idle."""

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
        last = min(first + count, self._fetches.block_count(ref))
        index = first
        while index < last:
            block = ref.block(index)
            if block in self.ram or block in self._fetches:
                index += 1
            elif block in self.disk:
                # A small object's block stays on disk, where its reader reads it (see
                # `TierStack._read_small`): promoting it would only read it twice.
                if not self._fetches.is_small(ref) and self._fetches.block_future(
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
            if not self._fetches.slots.acquire(blocking=False):
                return index
            run = self._fetches.claim_run((ref.block(each) for each in range(index, last)),
                                          self._piece_blocks)
            index += len(run)
            if not run:
                self._fetches.slots.release()
                return index
            self._fetches.pool.submit(self._stream, ref, run)
            if len(run) < self._piece_blocks:
                return index
        return index

    def _stream(self, ref: ObjectRef, run: list[tuple[BlockId, Future[bytes]]]) -> None:
        try:
            if self.cluster is None:
                self._stream_from_store(ref, run)
            else:
                self._stream_through_cluster(ref, self.cluster, run)
        finally:
            self._fetches.slots.release()

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
            found = cluster.get_all([(block, self._fetches.block_length(ref, block.index))
                                     for block, _ in piece])
            for (block, future), data in zip(piece, found, strict=True):
                claimed = False
                if data is None:
                    data, claimed = cluster.claim_missing(
                        block, self._fetches.block_length(ref, block.index))
                if data is not None:
                    self._fetches.fetched(ref, block, future, data, write_behind=True,
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
                data = cluster.wait_for(block, self._fetches.block_length(ref, block.index))
                source = "cluster"
                if data is None:
                    data = self._fetches.get_block(ref, block.index)
                    source = "store"
            except Exception as problem:  # noqa: BLE001 - delivered to waiting readers
                future.set_exception(problem)
                self._fetches.done_loading(block)
                continue
            self._fetches.fetched(ref, block, future, data, write_behind=True, source=source,
                                  transient=True)

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
                    self._fetches.fetched(ref, block, future, data, write_behind=True,
                                          transient=True)
                    delivered += 1
        except Exception as error:  # noqa: BLE001 - the rest is fetched block by block
            if delivered < len(run) and not isinstance(error, SnapshotVersionGone):  # logged
                log.warning("streaming %s failed after %d of %d blocks (%s); fetching the rest "
                            "block by block", ref.key, delivered, len(run), error)
            for block, future in run[delivered:]:
                try:
                    data = self._fetches.get_block(ref, block.index)
                except Exception as problem:  # noqa: BLE001 - delivered to waiting readers
                    future.set_exception(problem)
                    self._fetches.done_loading(block)
                    continue
                self._fetches.fetched(ref, block, future, data, transient=True)


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
