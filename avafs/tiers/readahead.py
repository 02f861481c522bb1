"""Read-ahead of one open file: which blocks to stream ahead of its reader, and when.

Sequential readers get streams of blocks ahead of them, started before the read that needs the
first of them, so even a file's first block comes with its successors in one stream. Random
readers fetch only the blocks they touch. The mechanism is `streams.py` (`Streams.stream`
starts the GETs and says how far it got); this object keeps the one reader's position and
decides what to ask for, and is driven only by `TierStack.read_async`, on the FUSE loop, so it
needs no lock.

Invariants:
- `next_block` is where a sequential reader reads next; a read counts as sequential if it
  starts one block before it (a block read again in pieces) up to the further of it and
  `frontier`: the kernel's own read-ahead sends several READs at once, which may arrive out of
  order, and a read inside what is already streaming is still sequential.
- `frontier` only grows: blocks before it are cached or loading for this reader. A new stream
  is asked for only once the reader is within `initial_window` blocks of it.
- `window` starts at `initial_window` and doubles, up to `MAX_WINDOW`, after each stream that
  got at least one block going; a stream that got none (no fetch slot free) leaves it as is.
- A file's tail no longer than the window joins the stream instead of being a second one,
  which the reader would otherwise wait for at the end of the first: a short tail goes into
  the stream's last piece (`STREAM_PIECE`) or a piece beside the others, not a request after
  them.
- A stream of a doubled window goes in more pieces side by side, so the longer a reader stays
  sequential, the more connections it reads over.
"""

from __future__ import annotations

MAX_WINDOW = 64
"""Most blocks one read-ahead stream asks for."""


class ReadAhead:
    __slots__ = ("frontier", "initial_window", "next_block", "window")

    def __init__(self, initial_window: int) -> None:
        """`initial_window`: blocks the first stream asks for (`--read-ahead`); 0 turns
        read-ahead off."""
        self.initial_window = initial_window
        self.next_block = 0
        self.frontier = 0
        self.window = 0
        """Blocks the next stream asks for; 0 until a stream has started."""

    def next_stream(self, span: range, block_count: int) -> range | None:
        """Takes note of a read of the blocks in `span` (non-empty) of an object of
        `block_count` blocks; the blocks to stream ahead of it, or None if none are due."""
        sequential = self.next_block - 1 <= span.start <= max(self.next_block, self.frontier)
        self.next_block = max(self.next_block, span.stop) if sequential else span.stop
        if not sequential or not self.initial_window or \
                self.frontier - span.stop >= self.initial_window:
            return None
        first = max(self.frontier, span.start)
        window = self.window or self.initial_window
        tail = block_count - first - window
        if 0 < tail <= window:
            window = min(window + tail, MAX_WINDOW)
        return range(first, first + window)

    def streamed(self, wanted: range, frontier: int) -> None:
        """The stream asked for `wanted` (from `next_stream`) has blocks up to `frontier`
        cached or loading."""
        if frontier > wanted.start:
            self.window = min(len(wanted) * 2, MAX_WINDOW)
        self.frontier = max(self.frontier, frontier)
