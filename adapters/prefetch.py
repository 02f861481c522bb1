"""Tells the mount which files this reader will open next, so they load before they are needed.

Client-side prefetch (DataLoader workers, tf.data) only hides latency for the few samples in
flight; the mount can start fetching far ahead, at low priority, only if it is told the reader's
future order. A reader knows that order exactly (it is arithmetic, see `splitting.py`), so the
hinter walks it and keeps `ahead` units queued. Hints go out in batches of at least half the
window, so a reader of small files makes one control call per `ahead / 2` samples, not one each.
Hints are advice: a failed hint is logged and training goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from avafs.client import Client

log = logging.getLogger(__name__)


class MountHints:
    """Sends prefetch hints to one mount; a failed hint is logged once, never raised."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.failures = 0

    def send(self, paths: Sequence[str]) -> None:
        from avafs.errors import AvafsError

        try:
            self.client.prefetch(paths)
        except (OSError, AvafsError) as error:
            self.failures += 1
            if self.failures == 1:
                log.warning("prefetch hint to %s failed, continuing without it: %s",
                            self.client.mountpoint, error)


class PrefetchHinter:
    """Walks a reader's known future order and keeps the next `ahead` units hinted."""

    def __init__(self, client: Client, ahead: int, upcoming: Sequence[str]) -> None:
        """`upcoming` is this reader's remaining read order of unit paths, duplicates allowed."""
        self.hints = MountHints(client)
        self.ahead = ahead
        self.upcoming = upcoming
        self.hinted_until = 0

    def reached(self, index: int) -> None:
        """The reader is about to open `upcoming[index]`; keep `ahead` units after it queued."""
        window_end = min(index + 1 + self.ahead, len(self.upcoming))
        reached_end = window_end == len(self.upcoming)
        if window_end - self.hinted_until < max(1, self.ahead // 2) and not reached_end:
            return
        start = max(self.hinted_until, index + 1)
        if start >= window_end:
            return
        self.hinted_until = window_end
        self.hints.send(list(dict.fromkeys(self.upcoming[start:window_end])))
