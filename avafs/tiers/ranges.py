"""How many ranged GETs side by side a read-ahead stream is cut into, learned from throughput.

One GET streams a run of blocks over one connection; whether more connections bring more
bytes a second depends on the store (a server that spreads ranges over its disks, or a
distant one whose latency leaves one connection idle) and on the machine (on a busy one, more
threads reading sockets only compete for the cores). So the width is measured, as TCP finds
its window: it starts at one GET and doubles while each doubling brings at least GROWTH
times the throughput of the width before; a doubling that does not is undone, and the width
stays there for REPROBE streams before it tries the next one again (the store's load moves).

Throughput is a whole stream's: its bytes over the time from its start until its last GET is
read, so a stream cut in four counts once. Only streams cut into the current width count: a
shorter run, cut into fewer GETs, or one started before the width last changed, says nothing
about the width now tried.

Thread-safety: `width` is read on the FUSE loop and by batch readers, `measured` is called
from the fetch threads; both take the lock, briefly.
"""

from __future__ import annotations

import threading
import time

GROWTH = 1.15
"""Throughput a doubled width must bring over the width before it to be kept."""

REPROBE = 16
"""Streams measured at a width that a failed doubling came back to, before doubling again."""


class StreamWidth:
    def __init__(self, most: int) -> None:
        """`most`: the widest a stream may be cut (the fetch slots bound every GET in flight
        together; this bounds one stream's)."""
        self._most = max(1, most)
        self._width = 1
        self._rate = 0.0
        """Bytes/s of the latest stream measured at the width before a doubling under trial."""
        self._probing = False
        """Whether `_width` was just doubled and awaits its first measurement."""
        self._ramping = True
        """Whether every doubling so far paid (then the next is tried at once)."""
        self._streams = 0
        """Streams measured at this width since it last changed."""
        self._lock = threading.Lock()

    def width(self) -> int:
        with self._lock:
            return self._width

    def measured(self, width: int, size: int, seconds: float) -> None:
        """A stream cut into `width` GETs brought `size` bytes in `seconds`."""
        if seconds <= 0:
            return
        rate = size / seconds
        with self._lock:
            if width != self._width:
                return
            if self._probing:
                self._probing = False
                if rate < self._rate * GROWTH:
                    self._width //= 2
                    self._ramping = False
                    self._streams = 0
                    return
                self._ramping = True
            self._rate = rate
            self._streams += 1
            if self._width < self._most and (self._ramping or self._streams >= REPROBE):
                self._width *= 2
                self._probing = True
                self._streams = 0


class StreamClock:
    """Times one stream cut into `width` GETs, and reports it to its StreamWidth once the
    last GET is read (the GETs run in different fetch threads)."""

    def __init__(self, widths: StreamWidth, width: int, size: int) -> None:
        self._widths = widths
        self._width = width
        self._size = size
        self._pending = width
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def read_one(self) -> None:
        """One of the stream's GETs has been read to its end (or given up)."""
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._widths.measured(self._width, self._size, time.monotonic() - self._started)
