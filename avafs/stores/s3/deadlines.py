"""Whole-request deadlines for data reads, enforced while the body is read.

Why: a socket's read timeout bounds each wait for bytes, not the request, so a store that
trickles a body (a few bytes a second) would hold a reader forever. A request's body is read
under a `Watch`: one watchdog thread per store shuts the connection down once the deadline
passes, which ends the blocked read with an error that `DeadlineBody` reports as
`DeadlinePassed`. Shutting the socket down (not closing it) is what wakes a read blocked in
another thread.

Invariant: a watch is cancelled, under the watchdog's lock, before its connection goes back to
the pool, so the watchdog never shuts down a connection another request took since. The lock
is the only one here and is never held while calling out.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import Any


class DeadlinePassed(TimeoutError):
    """The request's deadline passed before its body was read to the end."""


class Watch:
    """One request's deadline; `fired` once the watchdog shut its connection down."""

    __slots__ = ("sock", "done", "fired")

    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock
        self.done = False
        self.fired = False


class Deadlines:
    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket | None, seconds: float) -> Watch:
        """Shut `sock` down `seconds` from now unless the watch is cancelled first. A body
        whose socket cannot be found (None) is watched all the same: its read then ends at
        the socket's own timeout, and `fired` still tells the deadline passed."""
        watch = Watch(sock)
        deadline = time.monotonic() + seconds
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="s3-deadlines",
                                                daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (deadline, next(self._order), watch))
            if self._heap[0][2] is watch:
                self._changed.notify()
        return watch

    def cancel(self, watch: Watch) -> None:
        with self._changed:
            watch.done = True

    def _run(self) -> None:
        with self._changed:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._changed.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                watch = heapq.heappop(self._heap)[2]
                watch.done = watch.fired = True
                if watch.sock is not None:
                    with contextlib.suppress(OSError):
                        watch.sock.shutdown(socket.SHUT_RDWR)


class DeadlineBody:
    """A urllib3 response body read under a deadline: the connection goes back to the pool
    once the body was read to the end in time, and is dropped otherwise."""

    def __init__(self, raw: Any, deadlines: Deadlines, seconds: float) -> None:
        self._raw = raw
        self._deadlines = deadlines
        self._seconds = seconds
        self._watch = deadlines.watch(_socket_of(raw), seconds)

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._raw.read(None if size < 0 else size)
        except Exception:
            if self._watch.fired:
                raise self._late() from None
            raise
        if self._watch.fired:
            raise self._late()
        if self._raw.length_remaining == 0:
            self._deadlines.cancel(self._watch)
        return data

    def _late(self) -> DeadlinePassed:
        return DeadlinePassed(f"the answer was not read to the end within {self._seconds:.1f}s")

    def close(self) -> None:
        self._deadlines.cancel(self._watch)
        if self._raw.length_remaining == 0 and not self._watch.fired:
            self._raw.release_conn()
        else:
            self._raw.close()


def _socket_of(raw: Any) -> socket.socket | None:
    """The socket a urllib3 response is read from. urllib3 and http.client keep it in private
    attributes: the file of the http.client response (`_fp.fp`, whose `raw` is a
    `socket.SocketIO` holding `_sock`), which is there whether or not the connection is kept
    alive (for an answer that closes the connection, the connection's own `sock` is None).
    None where they moved: the deadline then only marks the read as late once it ends."""
    reader = getattr(getattr(raw, "_fp", None), "fp", None)
    sock = getattr(getattr(reader, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None
