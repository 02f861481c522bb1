"""The bytes kept between a lookup's GET and the first READ (avafs/tiers/fresh.py): bounded
in bytes, oldest out first, every version of an evicted object forgotten."""

from __future__ import annotations

from avafs.objects import BlockId
from avafs.tiers.fresh import FreshBlocks


def _block(key: str, etag: str = "e1") -> BlockId:
    return BlockId("s3://bucket", key, etag, 0)


def test_the_oldest_blocks_leave_first_and_the_bytes_kept_stay_under_the_limit():
    fresh = FreshBlocks(limit=250)
    for number in range(5):
        fresh.keep(_block(f"k{number}"), bytes([number]) * 100)

    assert [_block(f"k{number}") in fresh for number in range(5)] == \
        [False, False, False, True, True]
    assert fresh.get(_block("k4")) == bytes([4]) * 100
    assert fresh.get(_block("k4")) == bytes([4]) * 100, "a read leaves the bytes for the next"
    fresh.keep(_block("huge"), b"x" * 251)
    assert _block("huge") not in fresh
    assert _block("k4") in fresh


def test_an_evicted_object_is_forgotten_in_every_version_and_no_other():
    fresh = FreshBlocks()
    fresh.keep(_block("a", "e1"), b"old")
    fresh.keep(_block("a", "e2"), b"new")
    fresh.keep(_block("b"), b"other")

    fresh.discard("s3://bucket", "a")

    assert fresh.get(_block("a", "e1")) is None and fresh.get(_block("a", "e2")) is None
    assert fresh.get(_block("b")) == b"other"
