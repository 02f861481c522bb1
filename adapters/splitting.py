"""Which samples each rank and each DataLoader worker reads in an epoch, as pure arithmetic.

An epoch is a fixed global sequence of sample positions, a pure function of (seed, epoch). Each
rank takes one contiguous, equally long span of it, and each worker a contiguous part of its
rank's span. Equal spans per rank keep DDP from hanging on a rank that ran out early; contiguous
spans keep a reader inside few shards. Because the order is a function and not a random state,
resuming needs only a count: the position after the last sample consumed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from adapters.errors import EmptyDatasetError


@dataclass(frozen=True, slots=True)
class ReaderSlot:
    """Where one reader sits: its rank in the job and its worker within the rank's DataLoader."""

    world_size: int = 1
    rank: int = 0
    num_workers: int = 1
    worker: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size or not 0 <= self.worker < self.num_workers:
            raise ValueError(f"invalid reader slot {self}")


@dataclass(frozen=True, slots=True)
class Span:
    """Positions [start, start + count) of the epoch sequence; positions past the end wrap."""

    start: int
    count: int


def unit_order(count: int, *, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The epoch's order of units (files or shards): identity, or a permutation of (seed, epoch)."""
    order = list(range(count))
    if shuffle:
        random.Random(f"avafs-units:{seed}:{epoch}").shuffle(order)
    return order


def rank_span(total: int, world_size: int, rank: int, *, drop_last: bool) -> Span:
    """An equal share per rank: the tail is dropped, or padded by wrapping to the epoch's start.

    Padding (the default, as DistributedSampler does) delivers every sample at least once; a few
    samples near the start of the epoch are seen twice. drop_last delivers each at most once.
    """
    per_rank = total // world_size if drop_last else math.ceil(total / world_size)
    if per_rank == 0:
        raise EmptyDatasetError(f"{total} samples cannot give each of {world_size} ranks one "
                                "sample with drop_last=True")
    return Span(start=rank * per_rank, count=per_rank)


def worker_span(span: Span, num_workers: int, worker: int) -> Span:
    """Splits a rank's span between DataLoader workers; sizes differ by at most one."""
    base, extra = divmod(span.count, num_workers)
    start = span.start + worker * base + min(worker, extra)
    return Span(start=start, count=base + (1 if worker < extra else 0))


def reader_span(total: int, slot: ReaderSlot, *, drop_last: bool) -> Span:
    return worker_span(rank_span(total, slot.world_size, slot.rank, drop_last=drop_last),
                       slot.num_workers, slot.worker)


def block_order(length: int, *, seed: int, epoch: int, block: int | tuple[int, ...]) -> list[int]:
    """Order within one shuffle block; keyed by the block's identity so a resume recomputes it."""
    order = list(range(length))
    random.Random(f"avafs-block:{seed}:{epoch}:{block}").shuffle(order)
    return order
