"""The disk tier's `dataset` policy (avafs/tiers/frequency.py), on a real DiskTier.

Shuffled epochs over a dataset twice the tier: LRU thrashes (a block read late in one epoch is
gone before its turn in the next); the policy keeps serving the tier's share, and the RAM
tier's policy (avafs/tiers/ram_window.py) adds a share of its own. Property tests:
whatever the reads, demotions, pins and reservations, the caps hold and pinned blocks (being
written) and the space reserved for dirty data are never taken.
"""

from __future__ import annotations

import itertools
import random
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from avafs.objects import BlockId, allocated
from avafs.tiers.disk import DiskTier
from avafs.tiers.frequency import FrequencyCache
from avafs.tiers.ram import RamTier
from avafs.tiers.ram_window import WINDOW_SHARE

BLOCK = 4096
TIER_BLOCKS = 50


def _block(index: int) -> BlockId:
    return BlockId("file:///bucket", f"sample-{index}", "etag", 0)


def _tier(root: Path, policy: str, blocks: int = TIER_BLOCKS,
          clock: Callable[[], float] | None = None) -> DiskTier:
    """A tier whose clock moves a period on at every look: each read counts (unless `clock`)."""
    return DiskTier(root, blocks * BLOCK, 10_000, 0.9, 0.75, policy, 1.0,
                    clock or itertools.count().__next__)


def _full_of_residents(root: Path, clock: Callable[[], float] | None = None) -> DiskTier:
    """A dataset-policy tier of 10 blocks holding 9 residents, each read once."""
    tier = _tier(root, "dataset", blocks=10, clock=clock)
    for index in range(9):
        tier.put(_block(index), b"r" * BLOCK)
    return tier


def _epoch(tier: DiskTier, samples: int, seed: int) -> float:
    """Reads every sample once in a shuffled order, as a training epoch does; the hit ratio."""
    order = list(range(samples))
    random.Random(seed).shuffle(order)
    hits = 0
    for index in order:
        if tier.get(_block(index)) is not None:
            hits += 1
        else:
            tier.put(_block(index), bytes([index % 251]) * BLOCK)
        assert tier.used <= tier.capacity
    return hits / samples


@pytest.mark.parametrize("policy, least", [("dataset", 0.9), ("lru", None)])
def test_shuffled_epochs_over_twice_the_tier_hit_its_share(tmp_path, policy, least):
    tier = _tier(tmp_path, policy)
    samples = 2 * TIER_BLOCKS
    share = int(TIER_BLOCKS * 0.9) / samples  # the policy fills the tier to its high watermark
    ratios = [_epoch(tier, samples, seed) for seed in range(5)]
    tier.close()
    if least is None:  # today's LRU, for contrast: the thrashing the policy is there to end
        assert max(ratios[1:]) < 0.5 * share
    else:
        assert min(ratios[1:]) >= least * share


def test_period_boundaries_within_epochs_do_not_churn_the_residents(tmp_path):
    """Epochs shorter than a period, some straddling a boundary: blocks read after it count
    one more than residents not reached yet (two, once offered again on demotion from RAM),
    and must not displace them, or such an epoch loses a share of its hits."""
    samples = 2 * TIER_BLOCKS
    now = [0.5]
    tier = _tier(tmp_path, "dataset", clock=lambda: now[0])
    share = int(TIER_BLOCKS * 0.9) / samples
    ratios = []
    for seed in range(10):
        order = list(range(samples))
        random.Random(seed).shuffle(order)
        hits = 0
        for index in order:
            now[0] += 0.3 / samples
            block = _block(index)
            if tier.get(block) is not None:
                hits += 1
                continue
            tier.put(block, bytes([index % 251]) * BLOCK)
            tier.put(block, bytes([index % 251]) * BLOCK, read=False)  # demoted from RAM
        ratios.append(hits / samples)
    tier.close()
    assert min(ratios[1:]) >= share


def test_a_working_set_that_fits_is_cached_whole(tmp_path):
    tier = _tier(tmp_path, "dataset")
    samples = int(TIER_BLOCKS * 0.8)
    _epoch(tier, samples, 0)
    assert [_epoch(tier, samples, seed) for seed in range(1, 3)] == [1.0, 1.0]
    tier.close()


def test_a_new_dataset_read_more_often_replaces_an_old_one(tmp_path):
    tier = _tier(tmp_path, "dataset")
    old = [_block(index) for index in range(TIER_BLOCKS)]
    for block in old:
        tier.put(block, b"o" * BLOCK)
    new = [BlockId("file:///bucket", f"new-{index}", "etag", 0) for index in range(TIER_BLOCKS)]
    for _ in range(5):  # the old blocks were read once: the new need three reads more
        for block in new:
            if tier.get(block) is None:
                tier.put(block, b"n" * BLOCK)
    assert sum(block in tier for block in new) >= int(TIER_BLOCKS * 0.9) - 1
    tier.close()


def test_demoted_blocks_do_not_count_as_reads(tmp_path):
    tier = _full_of_residents(tmp_path)
    newcomer = _block(100)
    for _ in range(5):  # offered again and again by the RAM tier, never read from the store
        tier.put(newcomer, b"n" * BLOCK, read=False)
    assert newcomer not in tier
    for _ in range(4):  # read before as often as the residents were, up to two times more
        tier.put(newcomer, b"n" * BLOCK)
        assert newcomer not in tier
    tier.put(newcomer, b"n" * BLOCK)  # a fifth read: read before three times more than they
    assert newcomer in tier
    tier.close()


def test_reads_within_one_period_count_once(tmp_path):
    """Readers read residents in place unseen for a period; a newcomer fetched again and
    again meanwhile (short epochs) must not look read more often than they are."""
    now = [0.0]
    tier = _full_of_residents(tmp_path, clock=lambda: now[0])
    for _ in range(5):
        tier.put(_block(100), b"n" * BLOCK)
    assert _block(100) not in tier
    for _ in range(4):
        now[0] += 1.0
        tier.put(_block(100), b"n" * BLOCK)
    assert _block(100) in tier
    tier.close()


def test_read_counts_survive_a_restart(tmp_path):
    tier = _tier(tmp_path, "dataset", blocks=10)
    residents = [_block(index) for index in range(9)]
    for block in residents:
        tier.put(block, b"r" * BLOCK)
        tier.get(block)
        tier.get(block)
    tier.close()

    tier = _tier(tmp_path, "dataset", blocks=10)
    for _ in range(3):  # read three times, as often as the residents: not enough
        tier.put(_block(100), b"n" * BLOCK)
    assert all(block in tier for block in residents)
    assert _block(100) not in tier
    tier.close()


def test_an_index_written_before_read_counts_is_read(tmp_path):
    tier = _tier(tmp_path, "lru")
    tier.put(_block(1), b"x" * BLOCK)
    tier.close()
    index = Rdict(str(tmp_path / "index"), options=Options(raw_mode=True))
    for key, value in index.items():  # as a tier of the release before read counts wrote it
        size, _, sequence = struct.unpack_from("<QIQ", value)  # (its checksum was a CRC-32)
        index[key] = struct.pack("<QIQ", size, zlib.crc32(b"x" * BLOCK), sequence)
    index.close()
    tier = _tier(tmp_path, "dataset")
    assert tier.get(_block(1)) == b"x" * BLOCK
    tier.close()


_operations = st.lists(st.tuples(
    st.sampled_from(["read", "demote", "hit", "pin", "unpin", "reserve"]),
    st.integers(0, 60), st.integers(1, 3 * BLOCK)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(_operations, st.integers(1, 20), st.integers(1, 40))
def test_caps_hold_and_pinned_blocks_stay(operations, capacity_blocks, capacity_entries):
    cache = FrequencyCache(capacity_blocks * BLOCK, capacity_entries, 0.9, 0.75, 64, 1.0,
                           itertools.count().__next__)
    pinned: set[int] = set()
    for operation, key, size in operations:
        if operation in ("read", "demote"):
            if key in cache or not cache.fits(size):
                continue
            if cache.admits(key, size, read=operation == "read"):
                for victim in cache.victims_to_admit(size):
                    assert victim not in pinned
                    cache.discard(victim)
                cache.add(key, size)
        elif operation == "hit":
            cache.touch(key)
        elif operation == "pin" and key in cache:
            cache.pin(key)
            pinned.add(key)
        elif operation == "unpin":
            cache.unpin(key)
            pinned.discard(key)
        elif operation == "reserve":
            cache.capacity_bytes = max(0, capacity_blocks * BLOCK - size)
            for victim in cache.victims_over_capacity():
                assert victim not in pinned
                cache.discard(victim)
        for victim in cache.victims_to_low_watermark():
            assert victim not in pinned
        assert all(key in cache for key in pinned)
        if not pinned:
            assert cache.used_bytes <= cache.capacity_bytes + 3 * BLOCK
            assert len(cache) <= capacity_entries


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["read", "demote", "hit", "reserve"]),
                          st.integers(0, 40), st.integers(1, 2 * BLOCK)), max_size=120))
def test_disk_tier_never_exceeds_its_caps_nor_takes_reserved_space(operations):
    with tempfile.TemporaryDirectory(prefix="avafs-policy-") as root:
        _check_caps(DiskTier(Path(root), 16 * BLOCK, 12, 0.9, 0.75, "dataset", 1.0,
                             itertools.count().__next__), operations)


def _check_caps(tier: DiskTier, operations: list[tuple[str, int, int]]) -> None:
    reserved = 0
    for operation, key, size in operations:
        block = _block(key)
        if operation == "read":
            tier.put(block, b"d" * size)
        elif operation == "demote":
            tier.put(block, b"d" * size, read=False)
        elif operation == "hit":
            tier.get(block)
        else:
            reserved = size
            tier.reserve(reserved)
        assert tier.used <= 16 * BLOCK - reserved
        assert len(tier) <= 12
        on_disk = sum(allocated(path.stat().st_size)
                      for path in (tier.root / "blocks").rglob("*") if path.is_file())
        assert on_disk == tier.used
    tier.close()


def _ram(policy: str, held_below: set[BlockId], blocks: int = TIER_BLOCKS) -> RamTier:
    """A RAM tier of `blocks` blocks whose clock moves a period on at every look."""
    return RamTier(blocks * BLOCK, 10_000, 0.9, 0.75, policy, held_below.__contains__, 1.0,
                   itertools.count().__next__)


def _ram_epoch(ram: RamTier, samples: int, seed: int,
               on_disk: frozenset[BlockId] = frozenset()) -> float:
    """Reads every sample once, shuffled; the ratio of hits on samples not `on_disk`."""
    order = list(range(samples))
    random.Random(seed).shuffle(order)
    hits = 0
    for index in order:
        if ram.get(_block(index)) is not None:
            hits += _block(index) not in on_disk
        else:
            ram.put(_block(index), bytes([index % 251]) * BLOCK)
        assert ram.used <= ram.capacity and len(ram) == len(ram.blocks())
    return hits / samples


@pytest.mark.parametrize("policy", ["dataset", "lru"])
def test_ram_keeps_a_share_of_what_the_disk_tier_does_not_hold(policy):
    """A dataset four times the RAM tier, half of it on the disk tier: under the dataset
    policy RAM's main part keeps blocks of the other half, epoch after epoch (hits on blocks
    the disk tier holds add nothing); LRU thrashes."""
    samples = 4 * TIER_BLOCKS
    on_disk = frozenset(_block(index) for index in range(0, samples, 2))
    ram = _ram(policy, set(on_disk))
    main_share = int(TIER_BLOCKS * (1 - WINDOW_SHARE) * 0.9) / samples
    ratios = [_ram_epoch(ram, samples, seed, on_disk) for seed in range(5)]
    if policy == "lru":
        assert max(ratios[1:]) < 0.5 * main_share
    else:
        assert min(ratios[1:]) >= 0.9 * main_share


def test_ram_serves_a_working_set_that_fits_whole():
    ram = _ram("dataset", set())
    samples = int(TIER_BLOCKS * 0.8)
    _ram_epoch(ram, samples, 0)
    assert [_ram_epoch(ram, samples, seed) for seed in range(1, 3)] == [1.0, 1.0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["read", "below", "discard", "evict"]),
                          st.integers(0, 40), st.integers(1, 3 * BLOCK)), max_size=200),
       st.integers(2, 20), st.integers(2, 40))
def test_ram_caps_hold_and_accounting_matches(operations, capacity_blocks, capacity_entries):
    on_disk: set[BlockId] = set()
    ram = RamTier(capacity_blocks * BLOCK, capacity_entries, 0.9, 0.75, "dataset",
                  on_disk.__contains__, 1.0, itertools.count().__next__)
    for operation, key, size in operations:
        block = _block(key)
        if operation == "read":
            if ram.get(block) is None:
                left = ram.put(block, b"d" * size)
                assert all(victim not in ram for victim, _ in left)
        elif operation == "below":
            on_disk.add(block)
        elif operation == "discard":
            ram.discard([block])
        elif ram.above_high_watermark():
            ram.evict_to_low_watermark()
        assert ram.used <= ram.capacity
        assert len(ram) <= capacity_entries
        assert ram.used == sum(len(ram.get(held) or b"") for held in ram.blocks())
