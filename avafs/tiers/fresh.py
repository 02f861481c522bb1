"""The bytes of small blocks a lookup just fetched, kept for the READ that follows it.

A cold small file opened by path is described by its LOOKUP with the GET that brings its
bytes (`TierStack.fetch_described`); the block goes to the disk tier, and without this the
READ a moment later opens, reads and checksums the file just written, after the OPEN has
opened it once more to hint the read to the kernel. Keeping the fetched bytes a little
while answers that READ from memory with neither. The bytes are those of one immutable
version (the block's id names its ETag), the same the disk tier was given, so a read that
finds them here reads what a read of the tier would.

Memory: at most `limit` bytes, the oldest dropped first; an entry is not removed when read
(the kernel may split a file's first read in two), only when newer ones push it out or its
object is evicted. Used on the request loop and, by a batch's reads and an eviction, from
other threads: one lock, held for a dict operation or a walk of at most `limit` bytes' worth
of entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..objects import BlockId

FRESH_BYTES = 4 << 20
"""Bytes kept: the small files of many readers between their lookups and first reads."""


class FreshBlocks:
    def __init__(self, limit: int = FRESH_BYTES) -> None:
        self._limit = limit
        self._blocks: OrderedDict[BlockId, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, block: BlockId) -> bool:
        with self._lock:
            return block in self._blocks

    def get(self, block: BlockId) -> bytes | None:
        with self._lock:
            return self._blocks.get(block)

    def keep(self, block: BlockId, data: bytes) -> None:
        with self._lock:
            if len(data) > self._limit or block in self._blocks:
                return
            self._blocks[block] = data
            self._bytes += len(data)
            while self._bytes > self._limit:
                _, oldest = self._blocks.popitem(last=False)
                self._bytes -= len(oldest)

    def discard(self, source: str, key: str) -> None:
        """Forget every block of an object (every version): it is being evicted."""
        with self._lock:
            for block in [block for block in self._blocks
                          if block.source == source and block.key == key]:
                self._bytes -= len(self._blocks.pop(block))
