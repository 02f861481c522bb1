"""Cache-aware order (`cache_aware=True`): in each shuffle window, cached samples first.

With a dataset larger than the mount's cache, part of every epoch comes from the store. A
reader that takes the cached samples of a window first, while it hints the mount to fetch the
window's others, overlaps those fetches with reads that cost nothing. Each window is a stable
partition of the epoch's shuffled order (cached, then not cached), so every sample is still
read exactly once per epoch and the epoch's sample set is unchanged.

Which samples were cached is asked of the mount once, when a reader starts its epoch
(`Client.cached`, which also tells the cache that these files are about to be read), and kept
as a bitmask: the order is a pure function of (seed, epoch, that mask), and a resumed reader
takes the mask from its saved state instead of asking again, so it resumes exactly where it
stopped even though the cache has changed since.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from avafs.client import Client

log = logging.getLogger(__name__)

CachedMask = int
"""Bit i set: the i-th sample of the reader's epoch order was cached when the epoch began."""


def cached_mask(client: Client | None, paths: Sequence[str]) -> CachedMask:
    """Which of `paths` the mount caches whole; none when not on a mount or if it cannot
    say (a failed query is logged and the epoch goes on in plain shuffled order)."""
    from avafs.errors import AvafsError

    if client is None or not paths:
        return 0
    try:
        shares = client.cached(paths)
    except (OSError, AvafsError) as error:
        log.warning("cache query to %s failed, reading in shuffled order: %s",
                    client.mountpoint, error)
        return 0
    return sum(1 << index for index, share in enumerate(shares) if share == 1.0)


def windows(count: int, window: int, mask: CachedMask,
            skip: int = 0) -> Iterator[tuple[list[int], list[int]]]:
    """The cache-aware order of positions [0, count) after its first `skip`, window by window:
    for each window of `window` consecutive positions, those to read (its cached ones, then
    its others, each in epoch order) and, among them, the ones to fetch ahead."""
    done = 0
    for start in range(0, count, window):
        cached: list[int] = []
        missing: list[int] = []
        for position in range(start, min(start + window, count)):
            (cached if mask >> position & 1 else missing).append(position)
        drop = max(0, skip - done)
        done += len(cached) + len(missing)
        if drop < len(cached) + len(missing):
            yield (cached + missing)[drop:], missing[max(0, drop - len(cached)):]
