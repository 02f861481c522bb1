"""The RAM tier's `dataset` policy: a window of the blocks being read, and a main part that
keeps blocks the disk tier does not hold.

Why: in shuffled epochs over a dataset larger than the cache, an LRU RAM tier thrashes like an
LRU disk tier (`frequency.py`), and what it holds for a moment is mostly what the disk tier
holds too. Here RAM adds its own share to the disk tier's: its main part keeps blocks the disk
tier refused, read as often as the newcomers, epoch after epoch.

How (after W-TinyLFU): every block a read brings in enters the window, an LRU of
`WINDOW_SHARE` of the tier, which holds the blocks in flight (batches being read, read-ahead,
prefetched samples) whatever the policy decides for them later. A block pushed out of the
window leaves the tier if the disk tier holds it (`held_below`), else it is offered to the main
part, a `FrequencyCache` with the same admission rule as the disk tier's (reads counted once
per period, a newcomer must have been read in more periods than its victims by more than the
skew of a scan). Blocks the main part refuses, and its victims, leave the tier, and the tier
stack offers them to the disk tier as it does under LRU. Nothing is pinned in RAM.

Not thread-safe: the RAM tier calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from .frequency import FrequencyCache
from .lru import CappedLRU

WINDOW_SHARE = 0.5
"""Share of the tier for the window; it must hold the blocks read or prefetched but not yet
taken by their readers, or those are fetched again."""


class WindowedFrequencyCache:
    policy = "dataset"

    def __init__(self, capacity_bytes: int, capacity_entries: int, high_watermark: float,
                 low_watermark: float, recount_after: float, clock: Callable[[], float],
                 held_below: Callable[[Hashable], bool]) -> None:
        window_bytes = int(capacity_bytes * WINDOW_SHARE)
        window_entries = max(1, int(capacity_entries * WINDOW_SHARE))
        self._window = CappedLRU(window_bytes, window_entries, high_watermark, low_watermark)
        self._main = FrequencyCache(capacity_bytes - window_bytes,
                                    max(1, capacity_entries - window_entries), high_watermark,
                                    low_watermark, capacity_entries, recount_after, clock)
        self._held_below = held_below
        self.capacity_bytes = capacity_bytes
        self.capacity_entries = capacity_entries
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark

    @property
    def used_bytes(self) -> int:
        return self._window.used_bytes + self._main.used_bytes

    def __len__(self) -> int:
        return len(self._window) + len(self._main)

    def fits(self, size: int) -> bool:
        return self._window.fits(size)

    def touch(self, key: Hashable) -> bool:
        if self._window.touch(key):
            self._main.count_read(key)
            return True
        return self._main.touch(key)

    def insert(self, key: Hashable, size: int) -> list[Hashable]:
        """Puts a block just read into the window; returns the blocks that left the tier."""
        self.discard(key)
        self._main.count_read(key)
        left: list[Hashable] = []
        for pushed in self._window.victims_to_admit(size):
            pushed_size = self._window.discard(pushed)
            assert pushed_size is not None
            if self._held_below(pushed) or not self._main.fits(pushed_size) \
                    or not self._main.admits(pushed, pushed_size, read=False):
                left.append(pushed)
                continue
            for victim in self._main.victims_to_admit(pushed_size):
                self._main.discard(victim)
                left.append(victim)
            self._main.add(pushed, pushed_size)
        self._window.add(key, size)
        return left

    def discard(self, key: Hashable) -> int | None:
        size = self._window.discard(key)
        return self._main.discard(key) if size is None else size

    def above_high_watermark(self) -> bool:
        """The main part's watermark alone: the window makes room as blocks come in, and
        emptying it in the background would drop blocks in flight before the main part saw
        them."""
        return self._main.above_high_watermark()

    def victims_to_low_watermark(self) -> list[Hashable]:
        return self._main.victims_to_low_watermark()
