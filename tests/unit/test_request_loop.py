"""The request loop lent to threads (tiers/request_loop.py), and the batched reads that use it:
cold small objects of a `read_whole` batch are fetched with GETs sent from the loop, side by
side, and everything else, or everything when no loop serves, is read as before."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import BinaryIO

import pytest

from avafs.errors import ObjectChangedError
from avafs.metrics import Metrics
from avafs.objects import ObjectRef
from avafs.stores.local import LocalStore
from avafs.tiers.disk import DiskTier
from avafs.tiers.ram import RamTier
from avafs.tiers.request_loop import RequestLoop
from avafs.tiers.stack import TierStack

BLOCK = 64 * 1024


class _ServedLoop:
    """An asyncio loop running in a thread of its own, lent to `request_loop` while it runs."""

    def __init__(self, request_loop: RequestLoop) -> None:
        self.request_loop = request_loop
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        request_loop.serving(self.loop)

    def call(self, work) -> object:
        """`work()`'s answer, called on the loop's thread."""
        async def on_loop() -> object:
            return work()

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result(10)

    def stop(self) -> None:
        self.request_loop.ended()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served() -> Iterator[_ServedLoop]:
    served = _ServedLoop(RequestLoop())
    yield served
    served.stop()


def test_a_thread_gets_the_answer_of_work_run_on_the_loop(served):
    async def where(value: int) -> tuple[int, int]:
        await asyncio.sleep(0)
        return threading.get_ident(), value

    assert served.request_loop.run(where, 7) == (served.thread.ident, 7)


def test_the_work_s_error_is_raised_in_the_thread(served):
    async def fails() -> None:
        raise ObjectChangedError("changed")

    with pytest.raises(ObjectChangedError):
        served.request_loop.run(fails)


def test_no_loop_is_lent_before_serving_after_it_ended_or_to_the_loop_itself(served):
    async def answer() -> int:
        return 1

    assert RequestLoop().run(answer) is None, "before serving: the caller does the work"
    assert served.call(lambda: served.request_loop.run(answer)) is None, \
        "from the loop's own thread: it would wait for itself"
    served.request_loop.ended()
    assert served.request_loop.run(answer) is None


def test_a_thread_waiting_when_the_loop_ends_gets_none_and_the_work_is_cancelled(served):
    started = threading.Event()
    cancelled = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    answers: list[object] = []
    waiter = threading.Thread(target=lambda: answers.append(served.request_loop.run(forever)))
    waiter.start()
    assert started.wait(10)
    served.request_loop.ended()
    waiter.join(10)
    assert not waiter.is_alive() and answers == [None]
    assert cancelled.wait(10)


class _LoopAwareStore(LocalStore):
    """Records the thread each `get_range_async` is awaited on, and serves it from there, and
    the keys read otherwise (`get_range` and `open_range`, in threads)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.async_threads: list[int] = []
        self.read_in_threads: set[str] = set()

    async def get_range_async(self, key: str, start: int, length: int, etag: str,
                              threads: Executor) -> bytes:
        self.async_threads.append(threading.get_ident())
        return LocalStore.get_range(self, key, start, length, etag)

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        self.read_in_threads.add(key)
        return super().get_range(key, start, length, etag)

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        self.read_in_threads.add(key)
        return super().open_range(key, start, length, etag)


@pytest.fixture
def stack(tmp_path) -> Iterator[TierStack]:
    disk = DiskTier(tmp_path / "disk", 64 * BLOCK, 1000, 0.9, 0.7)
    stack = TierStack(RamTier(64 * BLOCK, 1000, 0.9, 0.7), disk, BLOCK, 32 * BLOCK,
                      Metrics(), 8)
    yield stack
    stack.close()


def _objects(tmp_path, sizes: dict[str, int]) -> tuple[_LoopAwareStore, dict[str, bytes]]:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    contents = {name: os.urandom(size) for name, size in sizes.items()}
    for name, data in contents.items():
        (bucket / name).write_bytes(data)
    return _LoopAwareStore(bucket), contents


def _refs(store: LocalStore, names) -> list[ObjectRef]:
    refs = []
    for name in names:
        info = store.head(name)
        refs.append(ObjectRef(store.url, store, name, info.etag, info.size))
    return refs


def test_a_batch_fetches_its_cold_small_objects_on_the_loop(tmp_path, stack):
    store, contents = _objects(tmp_path, {f"s{n}": 5_000 + n for n in range(6)}
                               | {"large": 3 * BLOCK})
    refs = _refs(store, contents)
    served = _ServedLoop(stack.request_loop)
    try:
        assert stack.read_whole(refs) == list(contents.values())
    finally:
        served.stop()
    assert store.async_threads == [served.thread.ident] * 6, "one GET each, from the loop"
    assert store.read_in_threads == {"large"}, "the large object is read as before"
    assert all(ref.block(0) in stack.disk for ref in refs[:6])


def test_a_batch_whose_fetch_slots_are_all_taken_waits_for_them_on_the_loop(tmp_path, stack):
    """Other fetches hold every slot when the batch starts: its GETs wait on the loop for the
    slots they free and go from there, none from the batch's thread."""
    store, contents = _objects(tmp_path, {f"s{n}": 5_000 + n for n in range(40)})
    refs = _refs(store, contents)
    slots = stack._fetches.slots
    held = 0
    while slots.acquire(blocking=False):
        held += 1
    assert 0 < held < len(refs)
    served = _ServedLoop(stack.request_loop)
    releaser = threading.Timer(0.2, lambda: [slots.release() for _ in range(held)])
    releaser.start()
    try:
        assert stack.read_whole(refs) == list(contents.values())
    finally:
        releaser.join()
        served.stop()
    assert store.async_threads == [served.thread.ident] * len(refs)
    assert store.read_in_threads == set()


def test_a_batch_reports_the_error_of_a_cold_object_fetched_on_the_loop(tmp_path, stack):
    store, contents = _objects(tmp_path, {"kept": 5_000, "replaced": 6_000})
    refs = _refs(store, contents)
    (tmp_path / "bucket" / "replaced").write_bytes(b"another version")
    served = _ServedLoop(stack.request_loop)
    try:
        kept, replaced = stack.read_whole(refs)
    finally:
        served.stop()
    assert kept == contents["kept"]
    assert isinstance(replaced, ObjectChangedError)
    assert refs[1].block(0) not in stack.disk


def test_without_a_serving_loop_a_batch_reads_in_threads_as_before(tmp_path, stack):
    store, contents = _objects(tmp_path, {f"s{n}": 4_000 + n for n in range(4)})
    refs = _refs(store, contents)
    assert stack.read_whole(refs) == list(contents.values())
    assert store.async_threads == [] and store.read_in_threads == set(contents)
    deadline = time.monotonic() + 10  # a stream writes each block after handing it over
    while not all(ref.block(0) in stack.disk for ref in refs):
        assert time.monotonic() < deadline, "the streamed objects never reached the disk tier"
        time.sleep(0.01)
