"""The fetch slots awaited on a loop (tiers/slots.py): a coroutine waits for a slot without
blocking its loop, gets the one a thread releases, and a waiter cancelled after its wake-up
passes it on, so a free slot never sits beside a sleeping waiter."""

from __future__ import annotations

import asyncio
import threading

import pytest

from avafs.tiers.slots import FetchSlots


def test_a_waiting_coroutine_gets_the_slot_a_thread_releases():
    slots = FetchSlots(1)
    assert slots.acquire(blocking=False)

    async def wait_while_the_loop_runs() -> list[str]:
        events: list[str] = []
        waiter = asyncio.create_task(slots.acquire_async())
        await asyncio.sleep(0.05)
        events.append("waiting" if not waiter.done() else "did not wait")
        threading.Thread(target=slots.release).start()
        await asyncio.wait_for(waiter, 10)
        events.append("acquired")
        return events

    assert asyncio.run(wait_while_the_loop_runs()) == ["waiting", "acquired"]
    assert not slots.acquire(blocking=False), "the waiter holds the one slot"


def test_a_free_slot_is_taken_without_waiting():
    slots = FetchSlots(2)

    async def take_both() -> None:
        await slots.acquire_async()
        await slots.acquire_async()

    asyncio.run(asyncio.wait_for(take_both(), 10))
    assert not slots.acquire(blocking=False)


def test_a_waiter_cancelled_after_its_wake_up_passes_the_slot_on():
    slots = FetchSlots(1)
    assert slots.acquire(blocking=False)

    async def cancel_the_woken_one() -> None:
        first = asyncio.create_task(slots.acquire_async())
        await asyncio.sleep(0.01)
        second = asyncio.create_task(slots.acquire_async())
        await asyncio.sleep(0.01)
        slots.release()  # wakes `first`, which is cancelled before it runs
        first.cancel()
        await asyncio.wait_for(second, 10)
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(cancel_the_woken_one())
    assert not slots.acquire(blocking=False), "the second waiter holds the slot"


def test_more_releases_than_slots_are_an_error():
    slots = FetchSlots(1)
    with pytest.raises(ValueError):
        slots.release()
