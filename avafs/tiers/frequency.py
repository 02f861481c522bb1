"""The disk tier's `dataset` policy: frequency-aware eviction with admission control.

Why: a training job reads a dataset larger than the tier once per epoch, in a new shuffled order
every epoch. Under LRU a block read late in one epoch is evicted before its turn in the next, so
almost nothing hits although the tier could serve its share of the dataset every epoch. A tier
that stops replacing blocks once it is full of blocks read as often as the newcomers serves
exactly that share.

How (after TinyLFU): a count-min sketch of small counters remembers how often every block was
read, cached or not (`FrequencySketch`). Each resident carries its own count of reads (the
sketch's estimate when it came in, plus one for each hit). While the tier has room under its
high watermark every block is admitted, as under LRU, so a working set that fits is cached
whole. Past it a newcomer gets in only if it had been read, before this read, in more than
`SCAN_SKEW` periods more than every resident it would replace (periods: see below). In shuffled
passes shorter than a period every block is read in every period, yet two blocks' counts can
differ by two: one for the first period, which a pass may straddle (blocks read before its end
count in it, the others do not), one for the current period (a block read in it already counts
it, a resident not reached yet does not). A newcomer one or two counts ahead is such a block,
and letting it in would evict a resident about to be read: at every period boundary a share of
the residents would churn. A newcomer read in three periods more than a resident (a dataset
that replaced another, a hot file) takes its place. Victims are the residents with the fewest
reads, the least recently used among equals, and an admission past the high watermark evicts
down to it, so background eviction does not churn a share of the residents on every pass.
Counts are halved every `AGING_PERIOD` reads per resident, so blocks that stop being read lose
their place.

A block's reads count at most once per `recount_after` seconds (the file reads' in-place
answer lifetime): a reader may read a resident's block file in place for that long without
asking (`Client.read_files`), so the tier sees a resident's reads no more often than that, and
counting a newcomer's misses faster (short epochs, a block fetched twice) would let it displace
residents read just as often. Reads served by the RAM tier or the page cache are not seen
either; the training adapters' cache query (`cache_aware`) counts every cached sample of an
epoch at its start.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from .lru import CappedLRU

ROWS = 4
MAX_COUNT = 255
AGING_PERIOD = 10
"""Reads per resident between two halvings of every count (TinyLFU's sample size)."""
SCAN_SKEW = 2
"""How many more periods two blocks of one shuffled scan can have been read in (above)."""
MIN_WIDTH = 1024
_HALVED = bytes(count >> 1 for count in range(256))


class FrequencySketch:
    """Count-min sketch of how often keys were read: `ROWS` rows of saturating byte counters.

    An estimate is never below the true count and exceeds it only through collisions, which a
    width of twice the expected number of keys keeps rare. A key counts once per period
    (`record`): beside each counter, the number of the period it last counted in (mod 255); a
    key whose slots all carry the current period's number has counted already (a collision
    can hide a read, rarely: all `ROWS` slots must collide)."""

    def __init__(self, expected_keys: int) -> None:
        width = MIN_WIDTH
        while width < 2 * expected_keys:
            width *= 2
        self._mask = width - 1
        self._rows = [bytearray(width) for _ in range(ROWS)]
        self._counted_in = [bytearray(width) for _ in range(ROWS)]

    def _slots(self, key: Hashable) -> list[int]:
        first = hash(key)
        step = hash((first, ROWS)) | 1
        return [(first + row * step) & self._mask for row in range(ROWS)]

    def estimate(self, key: Hashable) -> int:
        return min(row[slot] for row, slot in zip(self._rows, self._slots(key), strict=True))

    def record(self, key: Hashable, period: int) -> bool:
        """Counts a read in `period` unless the key counted in it already; True if counted."""
        slots = self._slots(key)
        tag = period % MAX_COUNT + 1
        if all(seen[slot] == tag for seen, slot in zip(self._counted_in, slots, strict=True)):
            return False
        for row, seen, slot in zip(self._rows, self._counted_in, slots, strict=True):
            seen[slot] = tag
            if row[slot] < MAX_COUNT:
                row[slot] += 1
        return True

    def halve(self) -> None:
        for row in self._rows:
            row[:] = row.translate(_HALVED)


class FrequencyCache(CappedLRU):
    """A CappedLRU whose victims are the least-read residents and which admits past its high
    watermark only newcomers read more often than their victims (see the module docstring).

    Not thread-safe, like CappedLRU: the tier calls it under its own lock."""

    policy = "dataset"

    def __init__(self, capacity_bytes: int, capacity_entries: int, high_watermark: float,
                 low_watermark: float, expected_keys: int, recount_after: float,
                 clock: Callable[[], float]) -> None:
        super().__init__(capacity_bytes, capacity_entries, high_watermark, low_watermark)
        self._sketch = FrequencySketch(expected_keys)
        self._recount_after = recount_after
        self._clock = clock
        self._reads: dict[Hashable, int] = {}
        self._by_reads: dict[int, OrderedDict[Hashable, None]] = {}
        self._reads_since_aging = 0

    def reads(self, key: Hashable) -> int:
        return self._reads.get(key, 0)

    def touch(self, key: Hashable) -> bool:
        if not super().touch(key):
            return False
        if self.count_read(key):
            self._place(key, min(MAX_COUNT, self._reads[key] + 1))
        return True

    def add(self, key: Hashable, size: int, reads: int | None = None) -> None:
        """Makes `key` resident with `reads` (a count kept across a restart) or else its
        history, which `admits` updated if this is a read."""
        super().add(key, size)
        if reads is None:
            reads = self._sketch.estimate(key)
        self._place(key, max(1, min(MAX_COUNT, reads)))

    def discard(self, key: Hashable) -> int | None:
        size = super().discard(key)
        if size is not None:
            self._unplace(key)
        return size

    def admits(self, key: Hashable, size: int, read: bool) -> bool:
        """Asked once for every read that missed (`read`), admitted or not, and for blocks
        offered without a read (demoted from RAM): only reads count towards a history."""
        history = self._sketch.estimate(key)
        if read:
            self.count_read(key)
        if self._room_under_high_watermark(size):
            return True
        victims = self.victims_to_admit(size)
        freed = sum(self._sizes[victim] for victim in victims)
        return (self.used_bytes - freed + size <= self.capacity_bytes
                and len(self) - len(victims) < self.capacity_entries
                and all(history > self._reads[victim] + SCAN_SKEW for victim in victims))

    def victims_to_admit(self, size: int) -> list[Hashable]:
        """Least-read residents to drop so `size` more bytes and one entry fit under the high
        watermark (which is under the cap)."""
        return self._coldest(int(self.capacity_bytes * self.high_watermark) - size,
                             int(self.capacity_entries * self.high_watermark) - 1)

    def _room_under_high_watermark(self, size: int) -> bool:
        return (self.used_bytes + size <= self.capacity_bytes * self.high_watermark
                and len(self) + 1 <= self.capacity_entries * self.high_watermark)

    def _coldest(self, target_bytes: int, target_entries: int) -> list[Hashable]:
        victims: list[Hashable] = []
        excess_bytes = self.used_bytes - target_bytes
        excess_entries = len(self) - target_entries
        for count in sorted(self._by_reads):
            for key in self._by_reads[count]:
                if excess_bytes <= 0 and excess_entries <= 0:
                    return victims
                if key in self._pinned:
                    continue
                victims.append(key)
                excess_bytes -= self._sizes[key]
                excess_entries -= 1
        return victims

    def count_read(self, key: Hashable) -> bool:
        """Counts a read unless the key counted in this period already; True if counted."""
        if not self._sketch.record(key, int(self._clock() // self._recount_after)):
            return False
        self._reads_since_aging += 1
        if self._reads_since_aging >= AGING_PERIOD * max(len(self), MIN_WIDTH):
            self._age()
        return True

    def _age(self) -> None:
        self._reads_since_aging = 0
        self._sketch.halve()
        residents = list(self._sizes)
        counts = {key: max(1, self._reads[key] >> 1) for key in residents}
        self._reads.clear()
        self._by_reads.clear()
        for key in residents:
            self._place(key, counts[key])

    def _place(self, key: Hashable, count: int) -> None:
        if key in self._reads:
            self._unplace(key)
        self._reads[key] = count
        self._by_reads.setdefault(count, OrderedDict())[key] = None

    def _unplace(self, key: Hashable) -> None:
        count = self._reads.pop(key)
        bucket = self._by_reads[count]
        del bucket[key]
        if not bucket:
            del self._by_reads[count]
