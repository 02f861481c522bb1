"""Reads of a large object answered from the disk tier's block files, not through RAM.

After a remount a large file's blocks are in the disk tier and none in RAM. Loading them into
RAM to answer the reader copies every byte into the daemon's memory, from which the kernel
copies it again, pinning that memory page by page. A reader on the FUSE loop that can send a
range of a file instead (pyfuse3's `FileRange`, which libfuse splices from the file's page
cache into /dev/fuse) is answered here: a range within one block as a `BlockFileRange`, a
range across two blocks by reading both files (in the caller's worker thread). Neither loads
a block into RAM or starts a stream; `TierStack.read_async` hints the files of the blocks its
reader's read-ahead would have streamed instead (`expect`), and decides when this applies:
only blocks the disk tier holds checked and RAM does not hold (`held`).

A block file is never rewritten with other bytes, but it may be evicted (unlinked) at any
time: a caller that finds a file gone, or shorter than its range (`read` here, a range's
receiver on open), reads the range as any block the tiers lack, which drops a damaged one.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ..metrics import Metrics
from ..objects import ObjectRef
from .disk import DiskTier
from .ram import RamTier


class BlockFileRange(NamedTuple):
    """`length` bytes of the disk tier's block file at `path` from `offset`."""

    path: str
    offset: int
    length: int


class BlockFileReads:
    def __init__(self, ram: RamTier, disk: DiskTier, block_size: int, metrics: Metrics) -> None:
        self._ram = ram
        self._disk = disk
        self._block_size = block_size
        self._metrics = metrics

    def held(self, ref: ObjectRef, span: range) -> list[str] | None:
        """The files of the span's blocks, if the disk tier holds every one checked and RAM
        holds none of them; else None."""
        files = []
        for index in span:
            block = ref.block(index)
            if block in self._ram:
                return None
            file = self._disk.checked_file(block)
            if file is None:
                return None
            files.append(f"{self._disk.root}/{file}")
        return files

    def expect(self, ref: ObjectRef, blocks: range) -> None:
        """The files of `blocks` start being read from the device (`DiskTier.expect_read`),
        so that the reader finds them in the page cache rather than waits for the device on
        the loop."""
        for index in blocks:
            self._disk.expect_read(ref.block(index))

    def range(self, path: str, index: int, offset: int, end: int) -> BlockFileRange:
        """Bytes [offset, end) of an object, all in block `index`, whose file is `path`."""
        self._metrics.tier_hits["disk"].inc()
        self._metrics.served_from["disk"].inc(end - offset)
        return BlockFileRange(path, offset - index * self._block_size, end - offset)

    def read(self, files: list[str], first: int, offset: int, end: int) -> bytes | None:
        """Bytes [offset, end) of an object from `files`, those of its blocks `first`, ...
        (blocks the caller's thread); None if a file was evicted meanwhile or is shorter
        than its block."""
        parts = []
        for position, path in enumerate(files):
            base = (first + position) * self._block_size
            start, stop = max(offset, base), min(end, base + self._block_size)
            try:
                with open(path, "rb", buffering=0) as file:
                    part = os.pread(file.fileno(), stop - start, start - base)
            except FileNotFoundError:
                return None
            if len(part) != stop - start:
                return None
            parts.append(part)
        self._metrics.tier_hits["disk"].inc(len(files))
        self._metrics.served_from["disk"].inc(end - offset)
        return b"".join(parts)
