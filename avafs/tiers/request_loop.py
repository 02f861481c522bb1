"""The daemon's request loop, lent to threads that want a coroutine run there.

Why: a small object's GET sent from the loop goes out on the loop's keep-alive pool with no
thread hop, and costs less CPU than the same GET from a worker thread, which wakes, takes the
GIL and hands it back for every request. Readers that already run in threads of their own
(the control socket's batched reads) hand their cold small objects to the loop this way.

The loop is lent only while it serves: the daemon calls `serving` once it runs and `ended`
on it before it stops. A thread never waits for a loop that has stopped: `run` answers None
(the caller then does the work itself) when no loop serves, from the loop's own thread
(which would wait for itself), and once `ended` was called or the loop cancelled the work.
No lock: the loop reference is one attribute, set and read whole.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_RECHECK = 1.0
"""Seconds between a waiting thread's checks that the loop still serves."""


class RequestLoop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def serving(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def ended(self) -> None:
        self._loop = None

    def run(self, work: Callable[..., Coroutine[Any, Any, T]], *args: object) -> T | None:
        """`work(*args)`'s answer, awaited on the loop (blocks the calling thread), or None
        where the loop cannot take it (see the module's docstring). Its errors are raised here."""
        loop = self._loop
        if loop is None or _running_loop() is loop:
            return None
        try:
            future = asyncio.run_coroutine_threadsafe(work(*args), loop)
        except RuntimeError:  # closed meanwhile
            return None
        while True:
            try:
                return future.result(timeout=_RECHECK)
            except concurrent.futures.CancelledError:
                return None
            except concurrent.futures.TimeoutError:
                if self._loop is not loop:
                    future.cancel()
                    return None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
