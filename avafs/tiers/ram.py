"""The RAM tier: immutable `bytes` blocks, LRU, hard-capped in bytes and blocks."""

from __future__ import annotations

import threading

from ..objects import BlockId
from .lru import CappedLRU, TierAccounting


class RamTier(TierAccounting):
    name = "ram"

    def __init__(self, capacity: int, capacity_blocks: int, high: float, low: float) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[BlockId, bytes] = {}
        self._lru = CappedLRU(capacity, capacity_blocks, high, low)

    @property
    def capacity(self) -> int:
        return self._lru.capacity_bytes

    def __contains__(self, block: BlockId) -> bool:
        return block in self._blocks

    def get(self, block: BlockId) -> bytes | None:
        with self._lock:
            data = self._blocks.get(block)
            if data is not None:
                self._lru.touch(block)
            return data

    def put(self, block: BlockId, data: bytes) -> list[tuple[BlockId, bytes]]:
        """Admit a block; returns the blocks pushed out to make room, for demotion."""
        with self._lock:
            if not self._lru.fits(len(data)):
                return []
            evicted = self._drop(self._lru.victims_to_admit(len(data)))
            self._blocks[block] = data
            self._lru.add(block, len(data))
            return evicted

    def evict_to_low_watermark(self) -> list[tuple[BlockId, bytes]]:
        with self._lock:
            return self._drop(self._lru.victims_to_low_watermark())

    def discard(self, blocks: list[BlockId]) -> int:
        with self._lock:
            return len(self._drop(blocks))

    def blocks(self) -> list[BlockId]:
        with self._lock:
            return list(self._blocks)

    def _drop(self, victims: list[BlockId]) -> list[tuple[BlockId, bytes]]:
        dropped = []
        for victim in victims:
            if self._lru.discard(victim) is not None:
                dropped.append((victim, self._blocks.pop(victim)))
        return dropped
