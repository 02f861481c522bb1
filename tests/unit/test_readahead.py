"""Read-ahead: which streams a reader's reads start, through `TierStack.read_async` over a
file:// store (no mount), and the sequential/random detection of `ReadAhead` itself.

The ranges pinned here are what the policy has done since it lived in the FUSE handlers: a
first stream of `--read-ahead` blocks, the window doubling up to `MAX_WINDOW` while the reader
stays sequential, a new stream once the reader is within the first window of the frontier, a
short tail joined to the stream before it, and no stream for a reader that jumps.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import pytest

from avafs.metrics import Metrics
from avafs.objects import ObjectRef
from avafs.stores.local import LocalStore
from avafs.tiers.disk import DiskTier
from avafs.tiers.ram import RamTier
from avafs.tiers.readahead import MAX_WINDOW, ReadAhead
from avafs.tiers.stack import TierStack

BLOCK = 4096
READ_AHEAD = 8


class _RecordingStore(LocalStore):
    """Records the block range of every streaming GET, and every single-block GET."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.streams: list[range] = []
        self.block_gets: list[int] = []
        self._lock = threading.Lock()

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        with self._lock:
            self.streams.append(range(start // BLOCK, -(-(start + length) // BLOCK)))
        return super().open_range(key, start, length, etag)

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        with self._lock:
            self.block_gets.append(start // BLOCK)
        return super().get_range(key, start, length, etag)


@pytest.fixture
def stack(tmp_path) -> Iterator[TierStack]:
    disk = DiskTier(tmp_path / "disk", 1024 * BLOCK, 10_000, 0.9, 0.7)
    stack = TierStack(RamTier(1024 * BLOCK, 10_000, 0.9, 0.7), disk, BLOCK, 64 * BLOCK,
                      Metrics(), READ_AHEAD)
    yield stack
    stack.close()


def _object(tmp_path, blocks: int) -> tuple[ObjectRef, bytes]:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    data = os.urandom(blocks * BLOCK)
    (bucket / "data").write_bytes(data)
    store = _RecordingStore(bucket)
    info = store.head("data")
    return ObjectRef(store.url, store, "data", info.etag, info.size), data


def _read_blocks(stack: TierStack, ref: ObjectRef, state: ReadAhead,
                 indices: list[int]) -> list[bytes]:
    """Reads each block in turn, as one open file's reader on the FUSE loop."""
    async def read_all() -> list[bytes]:
        with ThreadPoolExecutor(4) as threads:
            return [await stack.read_async(ref, index * BLOCK, BLOCK, state, threads)
                    for index in indices]

    return asyncio.run(read_all())


def test_a_sequential_reader_gets_streams_of_doubling_windows(tmp_path, stack):
    ref, data = _object(tmp_path, 200)
    state = stack.new_read_ahead()

    read = _read_blocks(stack, ref, state, list(range(200)))

    assert b"".join(read) == data
    # 8, then 16, 32, 64, 64; each asked for once the reader is within 8 blocks of the
    # frontier; the last stops at the object's end.
    assert ref.store.streams == [range(0, 8), range(8, 24), range(24, 56), range(56, 120),
                                 range(120, 184), range(184, 200)]
    assert ref.store.block_gets == []
    assert (state.window, state.frontier, state.next_block) == (MAX_WINDOW, 200, 200)


def test_a_short_tail_joins_the_stream_before_it(tmp_path, stack):
    ref, data = _object(tmp_path, READ_AHEAD + 4)

    assert b"".join(_read_blocks(stack, ref, stack.new_read_ahead(),
                                 list(range(READ_AHEAD + 4)))) == data
    assert ref.store.streams == [range(0, READ_AHEAD + 4)], "one GET for the whole file"


PIECE = 4
"""Blocks of a stream's GET in the tests of pieces (the stack's `stream_piece`)."""


@pytest.fixture
def piece_stack(tmp_path) -> Iterator[TierStack]:
    disk = DiskTier(tmp_path / "disk", 1024 * BLOCK, 10_000, 0.9, 0.7)
    stack = TierStack(RamTier(1024 * BLOCK, 10_000, 0.9, 0.7), disk, BLOCK, 64 * BLOCK,
                      Metrics(), READ_AHEAD, stream_piece=PIECE * BLOCK)
    yield stack
    stack.close()


def test_a_sequential_readers_streams_go_in_pieces_of_a_get_each(tmp_path, piece_stack):
    ref, data = _object(tmp_path, 200)

    read = _read_blocks(piece_stack, ref, piece_stack.new_read_ahead(), list(range(200)))

    assert b"".join(read) == data
    # The same windows as above (8, 16, 32, 64, 64, 16 blocks), each cut into GETs of
    # PIECE blocks, started from the fetch pool's threads in any order.
    assert sorted(ref.store.streams, key=lambda blocks: blocks.start) == \
        [range(start, start + PIECE) for start in range(0, 200, PIECE)]
    assert ref.store.block_gets == []


class _PairingStore(_RecordingStore):
    """Answers a streaming GET only once another one is under way beside it."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.paired = threading.Barrier(2, timeout=10)

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        self.paired.wait()
        return super().open_range(key, start, length, etag)


def test_a_streams_pieces_are_fetched_side_by_side(tmp_path, piece_stack):
    """A store that serves each connection at a bounded rate gives one reader several
    connections' worth only if the pieces of its window are in flight together: here the
    store answers neither GET of the first window until both have been sent."""
    ref, data = _object(tmp_path, 2 * PIECE)
    store = _PairingStore(ref.store.root)
    ref = ObjectRef(store.url, store, ref.key, ref.etag, ref.size)

    read = _read_blocks(piece_stack, ref, piece_stack.new_read_ahead(), list(range(2 * PIECE)))

    assert b"".join(read) == data
    assert sorted(store.streams, key=lambda blocks: blocks.start) == \
        [range(0, PIECE), range(PIECE, 2 * PIECE)]
    assert store.block_gets == [], "no piece fell back to single-block GETs"


def test_a_reader_that_jumps_streams_nothing_until_it_reads_on(tmp_path, stack):
    ref, data = _object(tmp_path, 200)
    state = stack.new_read_ahead()

    assert _read_blocks(stack, ref, state, [50, 120, 7]) == \
        [data[index * BLOCK:(index + 1) * BLOCK] for index in (50, 120, 7)]
    assert ref.store.streams == []
    assert sorted(ref.store.block_gets) == [7, 50, 120], "only the blocks it touched"

    _read_blocks(stack, ref, state, [8])  # reads on from block 7: sequential again
    assert ref.store.streams == [range(8, 8 + READ_AHEAD)]


def test_read_ahead_zero_streams_nothing(tmp_path, stack):
    ref, data = _object(tmp_path, 40)
    state = ReadAhead(0)

    assert b"".join(_read_blocks(stack, ref, state, list(range(40)))) == data
    assert ref.store.streams == []
    assert sorted(ref.store.block_gets) == list(range(40))


@pytest.mark.parametrize(("start", "sequential"), [
    (10, True),   # where the reader left off
    (9, True),    # one block back: the last block, read again in pieces
    (8, False),   # further back
    (11, True),   # ahead of the reader, inside what is streaming (the kernel's READs
    (12, True),   # arrive out of order), up to the frontier
    (13, False),  # past the frontier
])
def test_a_read_is_sequential_from_one_block_back_up_to_the_frontier(start, sequential):
    state = ReadAhead(READ_AHEAD)
    for index in range(10):  # streams that get no further than block 12
        wanted = state.next_stream(range(index, index + 1), 1000)
        if wanted is not None:
            state.streamed(wanted, min(wanted.stop, 12))
    assert (state.next_block, state.frontier, state.window) == (10, 12, 32)

    wanted = state.next_stream(range(start, start + 1), 1000)

    assert wanted == (range(max(12, start), max(12, start) + 32) if sequential else None)
    assert state.next_block == (max(10, start + 1) if sequential else start + 1)


def test_a_window_grows_only_when_its_stream_got_going():
    state = ReadAhead(READ_AHEAD)
    wanted = state.next_stream(range(0, 1), 200)
    state.streamed(wanted, 0)  # no fetch slot was free
    assert (state.window, state.frontier) == (0, 0)
    assert state.next_stream(range(1, 2), 200) == range(1, 9), "asked for again, same size"
    state.streamed(range(1, 9), 5)  # stopped at a busy slot after 4 blocks
    assert (state.window, state.frontier) == (16, 5)
    assert state.next_stream(range(2, 3), 200) == range(5, 21)


def test_a_jump_keeps_the_grown_window():
    state = ReadAhead(READ_AHEAD)
    for _ in range(3):
        wanted = state.next_stream(range(state.next_block, state.next_block + 1), 1000)
        if wanted is not None:
            state.streamed(wanted, wanted.stop)
    assert state.window == 32
    assert state.next_stream(range(500, 501), 1000) is None
    assert state.next_stream(range(501, 502), 1000) == range(501, 533)
