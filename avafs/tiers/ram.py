"""The RAM tier: immutable `bytes` blocks, hard-capped in bytes and blocks; least recently used,
or under the `dataset` policy a window and a main part that holds what the disk tier does not
(`ram_window.py`).

A block a read-ahead stream brought in for its reader is transient: it stays only until the
reader has gone past it (`release`), unless a warmup or prefetch asks for it in RAM (`keep`).
Why: the disk tier and the kernel's page cache of the mount hold the same bytes, and a RAM
tier that kept every block of a large file read once would take fresh memory for all of it,
which a machine whose memory is full of page cache has to reclaim while the read waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..objects import BlockId
from .lru import CappedLRU, TierAccounting
from .ram_window import WindowedFrequencyCache


class RamTier(TierAccounting):
    name = "ram"

    def __init__(self, capacity: int, capacity_blocks: int, high: float, low: float,
                 policy: str = "lru", held_below: Callable[[BlockId], bool] | None = None,
                 recount_after: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`policy`: "lru", or "dataset", whose main part keeps only blocks for which
        `held_below` (the disk tier holds it) is false, counting reads once per
        `recount_after` seconds of `clock` as the disk tier does."""
        self._lock = threading.Lock()
        self._blocks: dict[BlockId, bytes] = {}
        self._transient: set[BlockId] = set()
        """Held blocks a stream brought in, until released or kept (module docstring)."""
        self._lru: CappedLRU | WindowedFrequencyCache
        if policy == "dataset":
            if held_below is None:
                raise ValueError("the RAM tier's dataset policy needs the disk tier's held_below")
            self._lru = WindowedFrequencyCache(capacity, capacity_blocks, high, low,
                                               recount_after, clock, held_below)
        else:
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

    def put(self, block: BlockId, data: bytes,
            transient: bool = False) -> list[tuple[BlockId, bytes]]:
        """Admit a block, `transient` if a stream brought it for its reader; returns the
        blocks pushed out to make room, for demotion."""
        with self._lock:
            if not self._lru.fits(len(data)):
                return []
            self._blocks.pop(block, None)
            evicted = [(victim, self._blocks.pop(victim))
                       for victim in self._lru.insert(block, len(data))]
            self._transient.difference_update(victim for victim, _ in evicted)
            self._blocks[block] = data
            if transient:
                self._transient.add(block)
            else:
                self._transient.discard(block)
            return evicted

    def keep(self, block: BlockId) -> None:
        """A held block stays after its reader has gone past it (asked for in RAM)."""
        with self._lock:
            self._transient.discard(block)

    def release(self, blocks: list[BlockId]) -> int:
        """Drops those of `blocks` that are transient: their reader has gone past them, and
        the caller checked that another tier holds them. Returns how many."""
        with self._lock:
            return len(self._drop([block for block in blocks if block in self._transient]))

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
                self._transient.discard(victim)
        return dropped
