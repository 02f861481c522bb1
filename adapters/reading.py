"""The framework-neutral reading engine: which samples a reader yields, in what order, from where.

Both the PyTorch iterable dataset and TensorFlow's dynamic mode stream samples through a
`SampleReader`; the frameworks only decide where a reader sits (rank, worker) and how samples
leave (DataLoader batches, tf.data elements).

Static mode: the epoch's sample sequence is the units (files or shards) in epoch order,
concatenated; a reader takes its span of it (`splitting.py`) and, with `shuffle`, permutes it in
blocks of `shuffle_block_size` samples. One-file samples are already fully permuted by the unit
order, so blocks only apply to shards, whose samples must be streamed. Dynamic mode: a reader
leases tasks (ranges of positions in the epoch's unit order) from the coordinator instead.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from adapters.cache_order import CachedMask, cached_mask, windows
from adapters.elastic import leased_tasks, tagged_task_samples
from adapters.errors import EmptyDatasetError
from adapters.mounts import client_for
from adapters.prefetch import MountHints, PrefetchHinter
from adapters.sharding import CoordinatorClient, JobSpec, Lease
from adapters.shards import Sample, SampleFormat, count_samples, read_file_samples, read_samples
from adapters.sources import Item, ItemSource
from adapters.splitting import ReaderSlot, block_order, reader_span, unit_order

COUNTING_THREADS = 16


class SampleReader:
    """Reads one source in one format; picklable, so DataLoader workers get their own copy."""

    def __init__(self, source: ItemSource, fmt: SampleFormat, *, shuffle: bool, seed: int,
                 shuffle_block_size: int, drop_last: bool, prefetch_ahead: int,
                 cache_aware: bool = False) -> None:
        if shuffle_block_size < 1 or prefetch_ahead < 0:
            raise ValueError("shuffle_block_size must be >= 1 and prefetch_ahead >= 0")
        if cache_aware and (fmt.is_sharded or not shuffle):
            raise ValueError("cache_aware=True orders shuffled one-file samples: use it with "
                             "shuffle=True and format='files'")
        self.cache_aware = cache_aware
        self.source = source
        self.format = fmt
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_block_size = shuffle_block_size
        self.drop_last = drop_last
        self.prefetch_ahead = prefetch_ahead
        self._unit_counts: list[int] | None = None

    def counts(self) -> list[int]:
        """Samples per unit, in source order; shards are counted once, by their headers alone."""
        if self._unit_counts is None:
            items = self.source.items()
            if self.format.is_sharded:
                with ThreadPoolExecutor(min(COUNTING_THREADS, len(items))) as pool:
                    counts = list(pool.map(self._count, items))
                if not any(counts):
                    raise EmptyDatasetError(f"{self.source.describe()} has no samples: its "
                                            f"{len(items)} shards are empty")
                self._unit_counts = counts
            else:
                self._unit_counts = [1] * len(items)
        return self._unit_counts

    def span_length(self, world_size: int, rank: int) -> int:
        """Samples one rank reads per epoch in static mode; the same on every rank."""
        return reader_span(sum(self.counts()), ReaderSlot(world_size, rank),
                           drop_last=self.drop_last).count

    def _span_units(self, slot: ReaderSlot, epoch: int) -> list[Item]:
        """A reader's one-file samples of the epoch, in epoch order."""
        items = self.source.items()
        order = unit_order(len(items), shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        span = reader_span(len(items), slot, drop_last=self.drop_last)
        return [items[order[position % len(items)]]
                for position in range(span.start, span.start + span.count)]

    def cached_at_start(self, slot: ReaderSlot, epoch: int) -> CachedMask:
        """Which of the reader's samples of the epoch the mount caches now (cache_aware)."""
        units = self._span_units(slot, epoch)
        return cached_mask(client_for(self.source.root, require_mount=False),
                           [unit.path for unit in units])

    def static_samples(self, slot: ReaderSlot, epoch: int, skip: int,
                       cached: CachedMask = 0) -> Iterator[Sample]:
        """This reader's samples of the epoch, after the first `skip` of them; with
        cache_aware, `cached` is `cached_at_start` of this epoch."""
        if self.cache_aware:
            yield from self._cache_aware_samples(self._span_units(slot, epoch), skip, cached)
            return
        items = self.source.items()
        order = unit_order(len(items), shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        if not self.format.is_sharded:
            yield from self._units(self._span_units(slot, epoch)[skip:])
            return
        counts = self.counts()
        stream = _ShardStream(self.format, [items[unit] for unit in order],
                              [counts[unit] for unit in order])
        span = reader_span(stream.total, slot, drop_last=self.drop_last)
        if not self.shuffle:
            yield from stream.read(span.start + skip, span.count - skip, self._hinter)
            return
        block = self.shuffle_block_size
        first_block = skip // block * block
        start = span.start + first_block
        samples = stream.read(start, span.count - first_block, self._hinter)
        drop = skip - first_block
        for block_start in range(start, span.start + span.count, block):
            buffered = list(itertools.islice(samples, block))
            permutation = block_order(len(buffered), seed=self.seed, epoch=epoch, block=block_start)
            for index in permutation[drop:]:
                yield buffered[index]
            drop = 0

    def dynamic_samples(self, client: CoordinatorClient, epoch: int, worker: str,
                        task_size: int) -> Iterator[Sample]:
        """Samples of the tasks this reader leases, each tagged with its lease (`__lease__`)."""
        items = self.source.items()
        client.register(JobSpec(len(items), task_size, self.source.fingerprint()))
        order = unit_order(len(items), shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        for lease in leased_tasks(client, epoch, worker):
            units = [items[order[position]] for position in range(lease.start, lease.stop)]
            yield from tagged_task_samples(client, lease, self._task_samples(lease, units, epoch))

    def _count(self, item: Item) -> int:
        return count_samples(self.format, item)

    def _task_samples(self, lease: Lease, units: list[Item], epoch: int) -> Iterator[Sample]:
        samples = self._units(units)
        if not self.shuffle or not self.format.is_sharded:
            yield from samples
            return
        for block in itertools.count():
            buffered = list(itertools.islice(samples, self.shuffle_block_size))
            if not buffered:
                return
            permutation = block_order(len(buffered), seed=self.seed, epoch=epoch,
                                      block=(lease.task, block))
            yield from (buffered[index] for index in permutation)

    def _cache_aware_samples(self, units: list[Item], skip: int,
                             cached: CachedMask) -> Iterator[Sample]:
        """Each window's cached samples, then its others, which the mount is told to fetch as
        the window begins (see `cache_order.py`)."""
        client = client_for(self.source.root, require_mount=False)
        hints = None if client is None else MountHints(client)
        for read, fetch in windows(len(units), self.shuffle_block_size, cached, skip):
            if hints is not None and fetch:
                hints.send([units[position].path for position in fetch])
            yield from self._units([units[position] for position in read])

    def _units(self, units: list[Item]) -> Iterator[Sample]:
        """Every sample of `units` in order, hinting the mount about the units coming next."""
        hinter = self._hinter([unit.path for unit in units])
        if not self.format.is_sharded:
            client = client_for(self.source.root, require_mount=False)
            yield from read_file_samples(units, client,
                                         None if hinter is None else hinter.reached)
            return
        for index, unit in enumerate(units):
            if hinter is not None:
                hinter.reached(index)
            yield from read_samples(self.format, unit)

    def _hinter(self, upcoming: Sequence[str]) -> PrefetchHinter | None:
        if not self.prefetch_ahead:
            return None
        client = client_for(self.source.root, require_mount=False)
        return None if client is None else PrefetchHinter(client, self.prefetch_ahead, upcoming)


class _ShardStream:
    """The epoch's shards, in epoch order, as one sequence of samples addressed by position."""

    def __init__(self, fmt: SampleFormat, units: list[Item], counts: list[int]) -> None:
        self.format = fmt
        self.units = units
        self.counts = counts
        self.starts = list(itertools.accumulate(counts, initial=0))
        self.total = self.starts[-1]

    def read(self, start: int, count: int,
             make_hinter: Callable[[Sequence[str]], PrefetchHinter | None]) -> Iterator[Sample]:
        """`count` samples from position `start`, wrapping past the end (the padding of splits)."""
        visits = list(self._visits(start, count))
        hinter = make_hinter([self.units[unit].path for unit, _, _ in visits])
        for index, (unit, skip, take) in enumerate(visits):
            if hinter is not None:
                hinter.reached(index)
            yield from read_samples(self.format, self.units[unit], skip=skip, limit=take)

    def _visits(self, start: int, count: int) -> Iterator[tuple[int, int, int]]:
        """(unit, samples to skip in it, samples to take from it) along the span.

        bisect_right lands on the last unit starting at or before a position, which steps over
        empty shards, so every visit takes at least one sample.
        """
        position = start
        end = start + count
        while position < end:
            local = position % self.total
            unit = bisect.bisect_right(self.starts, local) - 1
            skip = local - self.starts[unit]
            take = min(self.counts[unit] - skip, end - position)
            yield unit, skip, take
            position += take
