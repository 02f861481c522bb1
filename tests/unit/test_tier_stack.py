"""TierStack's read-ahead against real tiers and a file:// store.

These pin down which tier a streamed block comes from, which a mount's counters cannot show:
after a remount, blocks that are only on the disk tier must still be brought into RAM ahead
of a sequential reader (a regression once made remounted files read block by block).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import pytest

from avafs.errors import ObjectChangedError
from avafs.metrics import Metrics
from avafs.objects import BlockId, ObjectRef
from avafs.stores.instrumented import InstrumentedStore
from avafs.stores.local import LocalStore
from avafs.tiers.block_file_reads import BlockFileRange
from avafs.tiers.disk import DiskTier
from avafs.tiers.ram import RamTier
from avafs.tiers.stack import TierStack
from avafs.tiers.write_behind import WRITE_BEHIND_BLOCKS

BLOCK = 64 * 1024
BLOCKS = 12


def _stack_over(disk: DiskTier) -> TierStack:
    return TierStack(RamTier(64 * BLOCK, 1000, 0.9, 0.7), disk, BLOCK, 32 * BLOCK, Metrics(), 8)


def _disk(root, tier_class: type[DiskTier] = DiskTier) -> DiskTier:
    return tier_class(root, 64 * BLOCK, 1000, 0.9, 0.7)


@pytest.fixture
def stack(tmp_path) -> Iterator[TierStack]:
    stack = _stack_over(_disk(tmp_path / "disk"))
    yield stack
    stack.close()


@pytest.fixture
def ref(tmp_path, stack) -> ObjectRef:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    (bucket / "data").write_bytes(os.urandom(BLOCKS * BLOCK - 100))
    store = InstrumentedStore(LocalStore(bucket), stack.metrics)
    info = store.head("data")
    return ObjectRef(store.url, store, "data", info.etag, info.size)


def _gets(stack: TierStack) -> float:
    return stack.metrics.value(stack.metrics.store_requests, "get")


def _read_on_loop(stack: TierStack, ref: ObjectRef, offset: int, size: int) -> bytes:
    """`read_async` as the FUSE loop calls it, with a fresh read-ahead state."""
    async def read() -> bytes:
        with ThreadPoolExecutor(1) as threads:
            return await stack.read_async(ref, offset, size, stack.new_read_ahead(), threads)

    return asyncio.run(read())


class _NoThreads(Executor):
    """An executor that refuses work: given to a read that must be answered on the loop."""

    def submit(self, fn: Callable[..., object], /, *args: object,
               **kwargs: object) -> Future[object]:
        raise AssertionError("the read asked for a worker thread")


def _read_inline(stack: TierStack, ref: ObjectRef, offset: int, size: int) -> bytes:
    """`read_async` with no worker thread to be had: a read that needed one fails."""
    return asyncio.run(stack.read_async(ref, offset, size, stack.new_read_ahead(), _NoThreads()))


def _wait_in_ram(stack: TierStack, ref: ObjectRef) -> None:
    """Waits, without reading (a read would load blocks itself), for every block in RAM."""
    deadline = time.monotonic() + 10
    while not all(stack.is_cached(ref, index, "ram") for index in range(stack.block_count(ref))):
        assert time.monotonic() < deadline, "streamed blocks never reached RAM"
        time.sleep(0.01)


def test_stream_of_missing_blocks_is_one_request(stack, ref):
    assert stack.streams.stream(ref, 0, BLOCKS) == BLOCKS
    _wait_in_ram(stack, ref)
    assert _gets(stack) == 1


def test_stream_promotes_disk_only_blocks_to_ram(stack, ref):
    for index in range(BLOCKS):
        stack.load(ref, index, to_ram=False)
    assert not any(stack.is_cached(ref, index, "ram") for index in range(BLOCKS))
    requests = _gets(stack)

    assert stack.streams.stream(ref, 0, BLOCKS) == BLOCKS
    _wait_in_ram(stack, ref)

    assert stack.metrics.value(stack.metrics.hits, "disk") == BLOCKS
    assert _gets(stack) == requests


def test_a_read_of_part_of_a_block_in_ram_is_a_view_of_it_not_a_copy(stack, ref):
    stack.streams.stream(ref, 0, 2)
    deadline = time.monotonic() + 10
    while not stack.is_cached(ref, 1, "ram"):
        assert time.monotonic() < deadline, "streamed blocks never reached RAM"
        time.sleep(0.01)
    block = stack.ram.get(ref.block(1))

    part = _read_inline(stack, ref, BLOCK + 100, 1000)
    assert isinstance(part, memoryview) and part.obj is block
    assert part == block[100:1100]
    assert _read_inline(stack, ref, BLOCK, BLOCK) is block


def _read_sequentially(stack: TierStack, ref: ObjectRef) -> bytes:
    """The object read block by block through `read_async` with one read-ahead state, as the
    FUSE loop reads an open file; after each read, waits until the disk tier holds every
    block read so far (the stream writes them behind its reader)."""
    async def read() -> bytes:
        read_ahead, parts = stack.new_read_ahead(), []
        with ThreadPoolExecutor(2) as threads:
            for index in range(stack.block_count(ref)):
                parts.append(await stack.read_async(ref, index * BLOCK, BLOCK, read_ahead,
                                                    threads))
                deadline = time.monotonic() + 10
                while not all(ref.block(done) in stack.disk for done in range(index + 1)):
                    assert time.monotonic() < deadline, "the stream never wrote its blocks"
                    await asyncio.sleep(0.01)
        return b"".join(parts)

    return asyncio.run(read())


def test_a_sequential_readers_streamed_blocks_leave_ram_once_passed(tmp_path, stack, ref):
    """Blocks a stream brought into RAM for its reader stay only until the reader has gone
    past them, the disk tier holding them: a large file read once must not fill RAM with
    what the disk tier and the kernel's page cache hold already. The block before the
    current one stays (READs arrive a few at a time, not always in order)."""
    data = _read_sequentially(stack, ref)

    assert data == (tmp_path / "bucket" / "data").read_bytes()
    in_ram = [index for index in range(BLOCKS) if stack.is_cached(ref, index, "ram")]
    assert in_ram == [BLOCKS - 2, BLOCKS - 1]
    assert all(stack.is_cached(ref, index, "disk") for index in range(BLOCKS))


def test_blocks_asked_for_in_ram_stay_when_a_reader_passes_them(stack, ref):
    """Warmups and prefetch hints into RAM (`load(to_ram=True)`) keep their blocks there,
    whether the block was loaded for them or had come in with a reader's stream."""
    stack.load(ref, 0, to_ram=True)
    assert stack.streams.stream(ref, 1, 2) == 3
    deadline = time.monotonic() + 10
    while not (stack.is_cached(ref, 1, "ram") and stack.is_cached(ref, 2, "ram")):
        assert time.monotonic() < deadline, "the stream never brought its blocks"
        time.sleep(0.01)
    stack.load(ref, 1, to_ram=True)

    _read_sequentially(stack, ref)

    kept = [index for index in range(BLOCKS - 2) if stack.is_cached(ref, index, "ram")]
    assert kept == [0, 1]


def test_stream_mixes_promotion_and_one_request_for_the_gap(stack, ref):
    for index in range(BLOCKS // 2):
        stack.load(ref, index, to_ram=False)
    requests = _gets(stack)

    assert stack.streams.stream(ref, 0, BLOCKS) == BLOCKS
    _wait_in_ram(stack, ref)

    assert stack.metrics.value(stack.metrics.hits, "disk") == BLOCKS // 2
    assert _gets(stack) == requests + 1


class _GatedDiskTier(DiskTier):
    """Holds every block write until `gate` opens."""

    def __init__(self, *args: object) -> None:
        self.gate = threading.Event()
        super().__init__(*args)

    def put(self, block: BlockId, data: bytes) -> None:
        assert self.gate.wait(10), "the test never opened the gate"
        super().put(block, data)


def _in_ram(stack: TierStack, ref: ObjectRef) -> int:
    return sum(stack.is_cached(ref, index, "ram") for index in range(stack.block_count(ref)))


def test_a_stream_reads_on_while_the_disk_is_behind_but_only_so_far(tmp_path, ref):
    disk = _disk(tmp_path / "gated-disk", _GatedDiskTier)
    stack = _stack_over(disk)
    try:
        assert stack.streams.stream(ref, 0, BLOCKS) == BLOCKS
        # Readers get a block before its disk write is taken in; the stream then waits.
        held = WRITE_BEHIND_BLOCKS + 1
        deadline = time.monotonic() + 10
        while _in_ram(stack, ref) < held:
            assert time.monotonic() < deadline, "the stream stopped before its write-behind room"
            time.sleep(0.01)
        time.sleep(0.2)
        assert _in_ram(stack, ref) == held, "the stream went on past its write-behind room"
        assert stack.read(ref, 0, 10) == (tmp_path / "bucket" / "data").read_bytes()[:10]

        disk.gate.set()
        _wait_in_ram(stack, ref)
    finally:
        disk.gate.set()
        stack.close()
    assert all(ref.block(index) in disk for index in range(BLOCKS)), \
        "close waits for the writes behind"


def test_streamed_blocks_are_on_disk_after_close(tmp_path, ref):
    root = tmp_path / "own-disk"
    stack = _stack_over(_disk(root))
    assert stack.streams.stream(ref, 0, BLOCKS) == BLOCKS
    _wait_in_ram(stack, ref)
    stack.close()

    data = (tmp_path / "bucket" / "data").read_bytes()
    disk = _disk(root)
    try:
        assert b"".join(disk.get(ref.block(index)) for index in range(BLOCKS)) == data
    finally:
        disk.close()


def test_small_objects_are_read_from_disk_in_the_callers_thread(tmp_path, stack):
    bucket = tmp_path / "small-bucket"
    bucket.mkdir()
    data = os.urandom(10_000)
    (bucket / "small").write_bytes(data)
    store = InstrumentedStore(LocalStore(bucket), stack.metrics)
    info = store.head("small")
    small = ObjectRef(store.url, store, "small", info.etag, info.size)
    stack.load(small, 0, to_ram=False)
    gets = _gets(stack)

    assert _read_inline(stack, small, 100, 50) == data[100:150]
    assert not stack.is_cached(small, 0, "ram"), "read from the disk tier, not copied to RAM"
    assert _read_inline(stack, small, 0, 10) == data[:10]
    assert stack.metrics.value(stack.metrics.hits, "disk") == 2
    assert _gets(stack) == gets


def test_only_a_small_object_not_in_ram_is_expected_to_be_read(tmp_path, stack, ref):
    """An open whose pages the kernel does not hold asks the disk tier to start reading only
    for a small object RAM does not hold (the disk tier itself ignores a block it does not
    hold): a large one comes through read-ahead, and one in RAM needs no device read."""
    expected: list[BlockId] = []
    stack.disk.expect_read = expected.append
    small, _ = _small_object(tmp_path, LocalStore)

    stack.load(small, 0, to_ram=False)
    stack.expect_read(small)
    stack.load(ref, 0, to_ram=False)
    stack.expect_read(ref)
    stack.load(small, 0, to_ram=True)
    stack.expect_read(small)

    assert expected == [small.block(0)]


def test_a_small_object_the_disk_tier_refuses_stays_in_ram(tmp_path):
    """Reads leave a small object's block out of RAM only because the disk tier holds it
    in memory already (through the page cache); one the disk tier does not take (here: a
    tier too small for it) must stay in RAM, or every read would fetch it again."""
    stack = _stack_over(DiskTier(tmp_path / "tiny-disk", 1024, 1000, 0.9, 0.7))
    try:
        small, data = _small_object(tmp_path, LocalStore)
        assert _read_on_loop(stack, small, 0, 100) == data[:100]
        assert stack.is_cached(small, 0, "ram") and small.block(0) not in stack.disk
    finally:
        stack.close()


def test_a_warmup_into_ram_puts_a_small_object_there(tmp_path, stack):
    """`avafs warmup --tier ram` and prefetch hints ask for RAM: they get it, whether the
    block was on disk already or fetched for them."""
    small, _ = _small_object(tmp_path, LocalStore)
    stack.load(small, 0, to_ram=False)
    assert not stack.is_cached(small, 0, "ram")
    stack.load(small, 0, to_ram=True)
    assert stack.is_cached(small, 0, "ram")

    (tmp_path / "other").mkdir()
    other, _ = _small_object(tmp_path / "other", LocalStore)
    stack.load(other, 0, to_ram=True)
    assert stack.is_cached(other, 0, "ram")


def test_a_batch_reads_small_objects_into_the_disk_tier_once_each(tmp_path, stack):
    """A batch (`read_whole`) streams what no tier has and reads the rest from the disk tier:
    small objects end on disk, not in RAM, and one on disk is read from it once, not first
    promoted by the batch's stream and then read again; the disk tier is asked to start
    reading all of the batch's files before the first is read (`expect_read`), so that after
    a remount the device reads them side by side."""
    bucket = tmp_path / "batch-bucket"
    bucket.mkdir()
    contents = {f"s{number}": os.urandom(5_000 + number) for number in range(6)}
    for name, data in contents.items():
        (bucket / name).write_bytes(data)
    store = InstrumentedStore(LocalStore(bucket), stack.metrics)
    refs = [ObjectRef(store.url, store, name, store.head(name).etag, len(data))
            for name, data in contents.items()]

    assert stack.read_whole(refs) == list(contents.values())
    deadline = time.monotonic() + 10  # the stream writes each block after handing it over
    while not all(ref.block(0) in stack.disk for ref in refs):
        assert time.monotonic() < deadline, "the streamed objects never reached the disk tier"
        time.sleep(0.01)
    assert not any(stack.is_cached(ref, 0, "ram") for ref in refs)
    hits = stack.metrics.value(stack.metrics.hits, "disk")
    expected: list[BlockId] = []
    expect_read = stack.disk.expect_read

    def expect_and_record(block: BlockId) -> None:
        expected.append(block)
        expect_read(block)

    stack.disk.expect_read = expect_and_record
    assert stack.read_whole(refs) == list(contents.values())
    assert stack.metrics.value(stack.metrics.hits, "disk") == hits + len(refs)
    assert expected == [ref.block(0) for ref in refs]


class _GatedStore(LocalStore):
    """Records which threads fetch, and holds each fetch until `gate` opens."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.fetching_threads: list[int] = []

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        self.fetching_threads.append(threading.get_ident())
        assert self.gate.wait(10), "the test never opened the gate"
        return super().get_range(key, start, length, etag)


def test_a_read_missing_one_block_loads_it_in_the_readers_thread(tmp_path, stack):
    bucket = tmp_path / "one-block-bucket"
    bucket.mkdir()
    data = os.urandom(BLOCK - 10)
    (bucket / "one").write_bytes(data)
    store = _GatedStore(bucket)
    info = store.head("one")
    one = ObjectRef(store.url, store, "one", info.etag, info.size)
    with ThreadPoolExecutor(2) as readers:
        first = readers.submit(lambda: (threading.get_ident(), stack.read(one, 0, 100)))
        deadline = time.monotonic() + 10
        while not store.fetching_threads:
            assert time.monotonic() < deadline, "the first read never fetched"
            time.sleep(0.01)
        second = readers.submit(stack.read, one, 200, 300)  # waits for the first one's load
        time.sleep(0.05)
        store.gate.set()
        reader_thread, head = first.result(10)
        assert head == data[:100]
        assert second.result(10) == data[200:500]
    assert store.fetching_threads == [reader_thread]
    assert one.block(0) in stack.disk and not stack.is_cached(one, 0, "ram")


def _small_object(tmp_path, store_class, size: int = 10_000) -> tuple[ObjectRef, bytes]:
    bucket = tmp_path / "small-bucket"
    bucket.mkdir()
    data = os.urandom(size)
    (bucket / "small").write_bytes(data)
    store = store_class(bucket)
    info = store.head("small")
    return ObjectRef(store.url, store, "small", info.etag, info.size), data


def test_a_cold_small_object_is_fetched_in_a_thread_and_then_served_on_the_loop(tmp_path,
                                                                               stack):
    small, data = _small_object(tmp_path, LocalStore)

    assert _read_on_loop(stack, small, 5, 20) == data[5:25]
    assert stack.is_cached(small, 0, "disk") and not stack.is_cached(small, 0, "ram")
    assert _read_inline(stack, small, 0, 10) == data[:10], "cached: served on the loop"


class _FailingGatedStore(_GatedStore):
    """A gated store whose fetches fail with `failure` once the gate opens, if it is set."""

    failure: Exception | None = None

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        data = super().get_range(key, start, length, etag)
        if self.failure is not None:
            raise self.failure
        return data


async def _loop_and_thread_reads(stack: TierStack, small: ObjectRef) -> dict[str, object]:
    """A read on the loop starts the fetch; a reader in a thread then asks for the same
    block while it is in flight. What each got, value or exception."""
    store = small.store
    store.gate.clear()
    results: dict[str, object] = {}

    async def read(name: str, call) -> None:
        try:
            results[name] = await call()
        except Exception as error:  # noqa: BLE001 - the test compares what each got
            results[name] = error

    with ThreadPoolExecutor(2) as threads:
        loop = asyncio.get_running_loop()
        on_loop = asyncio.create_task(read("loop", lambda: stack.read_async(
            small, 0, 100, stack.new_read_ahead(), threads)))
        while not store.fetching_threads:
            await asyncio.sleep(0.01)
        in_thread = asyncio.create_task(read("thread", lambda: loop.run_in_executor(
            threads, stack.read, small, 200, 300)))
        await asyncio.sleep(0.1)
        store.gate.set()
        await asyncio.gather(on_loop, in_thread)
    return results


def test_a_cold_small_read_from_the_loop_is_shared_with_a_reader_in_a_thread(tmp_path, stack):
    small, data = _small_object(tmp_path, _FailingGatedStore)

    results = asyncio.run(_loop_and_thread_reads(stack, small))

    assert results == {"loop": data[:100], "thread": data[200:500]}
    assert len(small.store.fetching_threads) == 1
    assert small.block(0) in stack.disk and not stack.is_cached(small, 0, "ram")


def test_a_failed_small_fetch_fails_every_waiting_reader_and_leaves_nothing_behind(tmp_path,
                                                                                  stack):
    small, data = _small_object(tmp_path, _FailingGatedStore)
    small.store.failure = ObjectChangedError("changed while being read")

    results = asyncio.run(_loop_and_thread_reads(stack, small))

    assert isinstance(results["loop"], ObjectChangedError)
    assert isinstance(results["thread"], ObjectChangedError)
    assert not stack.is_cached(small, 0, "disk")
    small.store.failure = None
    small.store.fetching_threads.clear()
    assert asyncio.run(_loop_and_thread_reads(stack, small))["loop"] == data[:100], \
        "the block is no longer marked loading and its fetch slot is free again"


class _StreamRecordingStore(_GatedStore):
    """A gated store that records the threads of streamed reads too."""

    def open_range(self, key: str, start: int, length: int, etag: str):
        self.fetching_threads.append(threading.get_ident())
        return super().open_range(key, start, length, etag)


def test_objects_of_more_than_one_small_block_are_fetched_off_the_loop(tmp_path, stack):
    large, data = _small_object(tmp_path, _StreamRecordingStore, size=BLOCK + 1)
    large.store.gate.set()

    assert _read_on_loop(stack, large, 0, 10) == data[:10]
    assert _read_on_loop(stack, large, BLOCK - 5, 6) == data[BLOCK - 5:]
    assert large.store.fetching_threads
    assert threading.get_ident() not in large.store.fetching_threads, "fetched on the loop"


def _on_disk_only(stack: TierStack, ref: ObjectRef) -> bytes:
    """Every block in the disk tier and none in RAM, as after a remount; the object's bytes."""
    for index in range(BLOCKS):
        stack.load(ref, index, to_ram=False)
    assert not any(stack.is_cached(ref, index, "ram") for index in range(BLOCKS))
    return b"".join(stack.disk.get(ref.block(index)) for index in range(BLOCKS))


def _read_ranges(stack: TierStack, ref: ObjectRef, offset: int, size: int,
                 threads: Executor) -> object:
    """`read_async` for a caller that takes file ranges, as the FUSE loop is."""
    return asyncio.run(stack.read_async(ref, offset, size, stack.new_read_ahead(), threads,
                                        file_ranges=True))


def test_a_read_within_a_block_only_on_disk_is_a_range_of_its_file(stack, ref):
    data = _on_disk_only(stack, ref)
    requests = _gets(stack)

    answer = _read_ranges(stack, ref, 3 * BLOCK + 100, 1000, _NoThreads())

    assert isinstance(answer, BlockFileRange) and (answer.offset, answer.length) == (100, 1000)
    with open(answer.path, "rb") as file:
        file.seek(answer.offset)
        assert file.read(answer.length) == data[3 * BLOCK + 100:3 * BLOCK + 1100]
    assert not any(stack.is_cached(ref, index, "ram") for index in range(BLOCKS))
    assert _gets(stack) == requests
    last = _read_ranges(stack, ref, (BLOCKS - 1) * BLOCK, BLOCK, _NoThreads())
    assert last.length == BLOCK - 100, "the object's end, not the block size"


def test_a_read_across_blocks_only_on_disk_is_read_from_their_files_not_into_ram(stack, ref):
    data = _on_disk_only(stack, ref)
    requests = _gets(stack)

    with ThreadPoolExecutor(1) as threads:
        answer = _read_ranges(stack, ref, 2 * BLOCK - 10, BLOCK, threads)

    assert answer == data[2 * BLOCK - 10:3 * BLOCK - 10]
    time.sleep(0.2)  # a stream, had one started, would bring blocks in meanwhile
    assert not any(stack.is_cached(ref, index, "ram") for index in range(BLOCKS))
    assert _gets(stack) == requests


class _EvictingFirst(ThreadPoolExecutor):
    """Unlinks a file before the first work it is given runs: an eviction in between."""

    def __init__(self, path: str) -> None:
        super().__init__(1)
        self.path: str | None = path

    def submit(self, fn: Callable[..., object], /, *args: object,
               **kwargs: object) -> Future[object]:
        if self.path is not None:
            os.unlink(self.path)
            self.path = None
        return super().submit(fn, *args, **kwargs)


def test_a_block_file_evicted_under_a_read_across_blocks_is_fetched_again(stack, ref):
    data = _on_disk_only(stack, ref)
    evicted = f"{stack.disk.root}/{stack.disk.checked_file(ref.block(5))}"

    with _EvictingFirst(evicted) as threads:
        answer = _read_ranges(stack, ref, 5 * BLOCK - 10, 20, threads)

    assert answer == data[5 * BLOCK - 10:5 * BLOCK + 10]


def test_a_caller_that_takes_no_ranges_gets_bytes_and_the_blocks_in_ram(stack, ref):
    data = _on_disk_only(stack, ref)

    assert _read_on_loop(stack, ref, 3 * BLOCK + 100, 1000) == data[3 * BLOCK + 100:
                                                                    3 * BLOCK + 1100]
    assert stack.is_cached(ref, 3, "ram")


def test_block_files_a_sequential_reader_reaches_are_hinted_and_a_random_readers_are_not(
        stack, ref, monkeypatch):
    _on_disk_only(stack, ref)
    hinted: list[int] = []
    monkeypatch.setattr(stack.disk, "expect_read", lambda block: hinted.append(block.index))

    def read(read_ahead: object, offset: int) -> None:
        with ThreadPoolExecutor(1) as threads:
            asyncio.run(stack.read_async(ref, offset, 1000, read_ahead, threads,
                                         file_ranges=True))

    sequential = stack.new_read_ahead()
    for offset in range(0, 3 * BLOCK, 1000):
        read(sequential, offset)
    assert hinted == list(range(BLOCKS)), "each block ahead of the reader, once"

    hinted.clear()
    scattered = stack.new_read_ahead()
    for index in (7, 2, 10, 4):
        read(scattered, index * BLOCK)
    assert hinted == []
