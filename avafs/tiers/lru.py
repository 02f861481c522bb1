"""Least-recently-used accounting with a hard cap and watermarks, shared by both tiers.

A cache that lets background eviction keep up overruns its limit whenever inserts come faster,
so the cap here is enforced on insert, synchronously, in bytes and in entries; the watermarks
only decide when background eviction starts and where it stops, to keep inserts cheap.
Pinned entries (dirty data, blocks being read) are never chosen for eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator


class CappedLRU:
    policy = "lru"

    def __init__(self, capacity_bytes: int, capacity_entries: int,
                 high_watermark: float, low_watermark: float) -> None:
        self.capacity_bytes = capacity_bytes
        self.capacity_entries = capacity_entries
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self._sizes: OrderedDict[Hashable, int] = OrderedDict()
        self._pinned: set[Hashable] = set()
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sizes

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._sizes)

    def touch(self, key: Hashable) -> bool:
        if key not in self._sizes:
            return False
        self._sizes.move_to_end(key)
        return True

    def add(self, key: Hashable, size: int, reads: int | None = None) -> None:
        """`reads`: a count of reads kept across a restart, for policies that count reads
        (`frequency.py`); recency is all LRU keeps."""
        self.discard(key)
        self._sizes[key] = size
        self.used_bytes += size

    def discard(self, key: Hashable) -> int | None:
        size = self._sizes.pop(key, None)
        if size is not None:
            self.used_bytes -= size
            self._pinned.discard(key)
        return size

    def pin(self, key: Hashable) -> None:
        self._pinned.add(key)

    def unpin(self, key: Hashable) -> None:
        self._pinned.discard(key)

    def reads(self, key: Hashable) -> int:
        """Reads counted for a resident: none, under LRU."""
        return 0

    def admits(self, key: Hashable, size: int, read: bool) -> bool:
        """Whether a block may come in at all (evicting `victims_to_admit`): always, under LRU."""
        return True

    def fits(self, size: int) -> bool:
        return size <= self.capacity_bytes

    def insert(self, key: Hashable, size: int) -> list[Hashable]:
        """Adds `key`, dropping the coldest entries to make room (pinned ones aside); returns
        them. For tiers that drop at once (RAM), where nothing is written in between."""
        victims = self.victims_to_admit(size)
        for victim in victims:
            self.discard(victim)
        self.add(key, size)
        return victims

    def victims_to_admit(self, size: int) -> list[Hashable]:
        """Coldest unpinned entries to drop so that `size` more bytes and one entry fit."""
        return self._coldest(self.capacity_bytes - size, self.capacity_entries - 1)

    def above_high_watermark(self) -> bool:
        return (self.used_bytes > self.capacity_bytes * self.high_watermark
                or len(self._sizes) > self.capacity_entries * self.high_watermark)

    def victims_over_capacity(self) -> list[Hashable]:
        return self._coldest(self.capacity_bytes, self.capacity_entries)

    def victims_to_low_watermark(self) -> list[Hashable]:
        return self._coldest(int(self.capacity_bytes * self.low_watermark),
                             int(self.capacity_entries * self.low_watermark))

    def _coldest(self, target_bytes: int, target_entries: int) -> list[Hashable]:
        victims: list[Hashable] = []
        excess_bytes = self.used_bytes - target_bytes
        excess_entries = len(self._sizes) - target_entries
        for key, size in self._sizes.items():
            if excess_bytes <= 0 and excess_entries <= 0:
                break
            if key in self._pinned:
                continue
            victims.append(key)
            excess_bytes -= size
            excess_entries -= 1
        return victims


class TierAccounting:
    """What every tier reports about its size and watermarks, read off its CappedLRU."""

    _lru: CappedLRU

    @property
    def policy(self) -> str:
        return self._lru.policy

    @property
    def used(self) -> int:
        return self._lru.used_bytes

    @property
    def capacity_files(self) -> int:
        return self._lru.capacity_entries

    @property
    def high_watermark(self) -> float:
        return self._lru.high_watermark

    @property
    def low_watermark(self) -> float:
        return self._lru.low_watermark

    def __len__(self) -> int:
        return len(self._lru)

    def above_high_watermark(self) -> bool:
        return self._lru.above_high_watermark()
