"""The evictor: a thread that keeps the RAM and disk tiers between their watermarks.

Inserts note the tiers' usage (`note_usage`); past a high watermark the evictor wakes and
brings the tier down to its low watermark, RAM's victims demoted to the disk tier, so an insert
rarely has to evict inline. Each tier still caps itself at its size plus one block.
"""

from __future__ import annotations

import threading

from ..metrics import Metrics
from .disk import DiskTier
from .ram import RamTier


class Evictor:
    def __init__(self, ram: RamTier, disk: DiskTier, metrics: Metrics) -> None:
        self.ram = ram
        self.disk = disk
        self.metrics = metrics
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._evict_in_background, daemon=True,
                                        name="avafs-evictor")
        self._thread.start()

    def note_usage(self) -> None:
        """A tier took a block: wake the evictor if either is above its high watermark."""
        if self.ram.above_high_watermark() or self.disk.above_high_watermark():
            self._wake.set()

    def _evict_in_background(self) -> None:
        """Keeps tiers under their high watermark so inserts rarely have to evict inline."""
        while not self._closed:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if self.ram.above_high_watermark():
                demoted = self.ram.evict_to_low_watermark()
                self.metrics.evictions.labels("ram").inc(len(demoted))
                for block, data in demoted:
                    if block not in self.disk:
                        self.disk.put(block, data, read=False)
            if self.disk.above_high_watermark():
                self.metrics.evictions.labels("disk").inc(self.disk.evict_to_low_watermark())

    def stop(self) -> None:
        """Ask the evictor to end after its current pass (`join` waits for it)."""
        self._closed = True
        self._wake.set()

    def join(self) -> None:
        self._thread.join(timeout=5)
