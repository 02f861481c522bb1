"""Write-behind: the disk tier's writes of fetched blocks, done after their readers have them.

A stream's blocks, and a block a load took from the cluster tier, reach their waiting readers
and RAM first; their disk writes go to a few writer threads here, at most WRITE_BEHIND_BLOCKS
behind, so neither a reader nor a stream's response waits for the disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..objects import BlockId

log = logging.getLogger(__name__)

WRITE_BEHIND_BLOCKS = 8
"""Blocks a stream may have fetched and not yet written to the disk tier; a stream that gets
this far ahead of the disk waits for it, so the bytes held for writing stay bounded."""

WRITE_BEHIND_THREADS = 2
"""Disk writes of streamed blocks at a time: a block of 1 MiB or more is a direct write (see
`block_files`) that keeps the device busy for milliseconds and the CPU for little, so two keep
a disk busy without taking the cores."""


class WriteBehind:
    def __init__(self, to_disk: Callable[[BlockId, bytes], None],
                 dropped: Callable[[BlockId], None]) -> None:
        """`to_disk` writes a block to the disk tier; `dropped` is told of a block whose
        write failed, which stays readable from RAM but is no longer being loaded."""
        self._to_disk = to_disk
        self._dropped = dropped
        self._writers = ThreadPoolExecutor(max_workers=WRITE_BEHIND_THREADS,
                                           thread_name_prefix="avafs-disk-write")
        self._room = threading.BoundedSemaphore(WRITE_BEHIND_BLOCKS)

    def submit(self, block: BlockId, data: bytes) -> None:
        """Write `block` to the disk tier in a writer thread; waits while WRITE_BEHIND_BLOCKS
        are still to be written."""
        self._room.acquire()
        self._writers.submit(self._write, block, data)

    def _write(self, block: BlockId, data: bytes) -> None:
        """Why streams do not write their blocks themselves: a stream's thread that stops
        reading its response for every disk write leaves the connection idle for as long as
        the write takes, which can be longer than reading the block."""
        try:
            self._to_disk(block, data)
        except Exception:  # noqa: BLE001 - a cache write; the block stays readable from RAM
            log.exception("disk tier: writing a block of %s failed", block.key)
            self._dropped(block)
        finally:
            self._room.release()

    def close(self) -> None:
        self._writers.shutdown(wait=True)
