"""The fetch slots: the in-flight budget (`--inflight-memory / --block-size` fetches at once),
taken by threads and awaited by the request loop.

Why the loop waits for a slot itself: a batch of whole-file reads (the control socket's
`read`) sends its cold small objects' GETs from the loop, where a GET costs a fraction of the
CPU it costs from a thread. Four readers' batches ask for more GETs at once than there are
slots, and a GET that found none free used to go to the batch's thread instead, at that
thread's cost per GET; waiting on the loop keeps it there, and the thread would have waited
for a slot anyway.

Wake-ups: a release wakes the oldest waiting coroutine, on its loop, which then tries again
(a thread may have taken the slot first; it waits again). A waiter puts itself in the queue
before its second try, so a release between its first try and its wait is never missed, and
one cancelled after it was woken passes the wake-up on, so a free slot never sits beside a
sleeping waiter. Lock order: `_lock` is a leaf (nothing is taken or called under it but the
queue's own operations).
"""

from __future__ import annotations

import asyncio
import collections
import threading


class FetchSlots:
    def __init__(self, count: int) -> None:
        self._semaphore = threading.BoundedSemaphore(count)
        self._lock = threading.Lock()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def acquire(self, blocking: bool = True) -> bool:
        """A slot for the calling thread, waiting for one if `blocking`; False if none."""
        return self._semaphore.acquire(blocking=blocking)

    def release(self) -> None:
        self._semaphore.release()
        self._wake_one()

    async def acquire_async(self) -> None:
        """A slot for the calling coroutine, waiting on its loop (never blocking it) until a
        release frees one."""
        while not self._semaphore.acquire(blocking=False):
            waiter = asyncio.get_running_loop().create_future()
            with self._lock:
                self._waiters.append(waiter)
            if self._semaphore.acquire(blocking=False):
                self._forget(waiter)
                return
            try:
                await waiter
            except BaseException:
                self._forget(waiter)
                raise

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        """Takes `waiter` out of the queue; if a release had already woken it, wakes the next
        one in its place."""
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return
        self._wake_one()

    def _wake_one(self) -> None:
        # Looked at without the lock first (the common case: nobody waits); a waiter that
        # queues itself after this look tries the semaphore once more before it waits.
        if not self._waiters:
            return
        with self._lock:
            if not self._waiters:
                return
            waiter = self._waiters.popleft()
        try:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)
        except RuntimeError:  # its loop has closed: nobody waits there any more
            self._wake_one()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
