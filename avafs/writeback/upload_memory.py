"""The memory that uploads in flight may hold, bounded in bytes rather than by their number.

A file below the multipart threshold goes up in one PutObject whose body is read whole, and a
larger one keeps a managed upload's parts in flight: either way an upload holds up to about
64 MiB. Small files, the common case, hold a few hundred KiB each, and how many go up at once
decides how much of a distant store's latency is hidden. So the number of uploaders is chosen
for latency and this budget for memory: a large file waits for its share, a small one only
when the large ones already hold the budget.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class UploadMemory:
    """At most `limit` bytes held at once by the threads in `held`. A share larger than the
    limit is cut to it, so the largest upload runs alone rather than never. The condition is
    taken with no other lock held; its holders wait for uploads that are under way, which
    end (done or failed), never for one another's locks."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._free = limit
        self._returned = threading.Condition()

    @contextlib.contextmanager
    def held(self, size: int) -> Iterator[None]:
        """Holds min(size, limit) bytes of the budget for the duration; waits until they fit.
        A share of nothing (a deletion, a copy) neither waits nor wakes the waiters."""
        share = min(size, self._limit)
        if not share:
            yield
            return
        with self._returned:
            self._returned.wait_for(lambda: self._free >= share)
            self._free -= share
        try:
            yield
        finally:
            with self._returned:
                self._free += share
                self._returned.notify_all()
