"""cache_aware=True on a real mount: cached samples first in each window, the rest hinted.

The mount's cache holds a known half of the dataset (warmed up, the rest evicted), so the
expected order is known: in each window, the warmed samples in epoch order, then the others.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from adapters_testlib import make_files
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from adapters.torch import AvaIterableDataset, AvaMapDataset, AvaShuffleSampler
from avafs.client import Client

WINDOW = 8
FILES = 40


@pytest.fixture
def dataset_mount(mount, local_bucket) -> tuple[Path, list[str]]:
    keys = make_files(local_bucket / "train", FILES)
    return mount(local_bucket.as_uri(), "--read-only"), keys


def _cache_exactly(client: Client, root: Path, keys: list[str], cached: set[str]) -> None:
    """Only `cached` in the cache, and still so a moment later: a read's answer may come
    before its block's disk write, and prefetch hints load in the background."""
    paths = [root / key for key in keys]
    expected = [1.0 if key in cached else 0.0 for key in keys]
    deadline = time.monotonic() + 60
    while True:
        client.evict([root / key for key in keys if key not in cached])
        client.warmup([root / key for key in sorted(cached)])
        time.sleep(0.2)
        prefetch = client.status()["prefetch"]
        if (client.cached(paths) == expected
                and prefetch["queued"] == prefetch["done"] + prefetch["failed"]):
            return
        assert time.monotonic() < deadline, "the cache never settled"


def _keys(loader) -> list[str]:
    return [key for batch in loader for key in batch["__key__"]]


def _assert_windows_put_cached_first(order: list[str], plain: list[str], cached: set[str]):
    assert sorted(order) == sorted(plain)
    for start in range(0, len(plain), WINDOW):
        window = plain[start:start + WINDOW]
        expected = ([key for key in window if key in cached]
                    + [key for key in window if key not in cached])
        assert order[start:start + WINDOW] == expected


def test_the_mount_says_which_files_it_caches(dataset_mount):
    mnt, keys = dataset_mount
    client = Client(mnt)
    _cache_exactly(client, mnt / "train", keys, set(keys[:3]))
    paths = [mnt / "train" / key for key in keys[:5]] + [mnt / "train" / "absent.bin"]
    assert client.cached(paths) == [1.0, 1.0, 1.0, 0.0, 0.0, None]


def test_iterable_epoch_reads_cached_samples_first_and_hints_the_rest(dataset_mount):
    mnt, keys = dataset_mount
    client = Client(mnt)
    cached = set(keys[::2])

    def epoch(cache_aware: bool) -> list[str]:
        dataset = AvaIterableDataset.from_prefix(mnt / "train", shuffle=True, seed=4,
                                                 shuffle_block_size=WINDOW,
                                                 cache_aware=cache_aware)
        dataset.set_epoch(1)
        return _keys(DataLoader(dataset, batch_size=5))

    plain = epoch(False)
    _cache_exactly(client, mnt / "train", keys, cached)
    hinted_before = client.status()["prefetch"]["queued"]
    first = epoch(True)
    _assert_windows_put_cached_first(first, plain, cached)
    assert client.status()["prefetch"]["queued"] - hinted_before == FILES - len(cached)
    _cache_exactly(client, mnt / "train", keys, cached)
    assert epoch(True) == first  # the same seed, epoch and cache contents: the same order


def test_iterable_resume_keeps_the_order_chosen_at_the_epochs_start(dataset_mount):
    mnt, keys = dataset_mount
    client = Client(mnt)
    cached = set(keys[1::3])

    def loader() -> StatefulDataLoader:
        dataset = AvaIterableDataset.from_prefix(mnt / "train", shuffle=True, seed=9,
                                                 shuffle_block_size=WINDOW, cache_aware=True)
        dataset.set_epoch(2)
        return StatefulDataLoader(dataset, batch_size=4)

    _cache_exactly(client, mnt / "train", keys, cached)
    full = _keys(loader())
    _cache_exactly(client, mnt / "train", keys, cached)
    interrupted = loader()
    consumed = _keys(itertools.islice(iter(interrupted), 3))
    state = interrupted.state_dict()
    client.warmup([mnt / "train"])  # the cache changes before the job resumes

    resumed = loader()
    resumed.load_state_dict(state)
    assert consumed + _keys(resumed) == full


def test_map_sampler_orders_windows_and_resumes_exactly(dataset_mount):
    mnt, keys = dataset_mount
    client = Client(mnt)
    cached = set(keys[:FILES // 2])
    dataset = AvaMapDataset.from_prefix(mnt / "train")

    def loader(cache_aware: bool) -> StatefulDataLoader:
        sampler = AvaShuffleSampler(dataset, seed=5, shuffle_window=WINDOW,
                                    cache_aware=cache_aware)
        sampler.set_epoch(3)
        return StatefulDataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=list)

    def keys_of(batches) -> list[str]:
        return [sample["__key__"] for batch in batches for sample in batch]

    plain = keys_of(loader(False))
    _cache_exactly(client, mnt / "train", keys, cached)
    full = keys_of(loader(True))
    _assert_windows_put_cached_first(full, plain, cached)

    _cache_exactly(client, mnt / "train", keys, cached)
    interrupted = loader(True)
    consumed = keys_of(itertools.islice(iter(interrupted), 3))
    state = interrupted.state_dict()
    client.warmup([mnt / "train"])
    resumed = loader(True)
    resumed.load_state_dict(state)
    assert consumed + keys_of(resumed) == full


def test_cache_aware_needs_shuffled_one_file_samples(dataset_mount):
    mnt, _ = dataset_mount
    with pytest.raises(ValueError, match="cache_aware=True"):
        AvaIterableDataset.from_prefix(mnt / "train", format="tar", shuffle=True,
                                       cache_aware=True)
