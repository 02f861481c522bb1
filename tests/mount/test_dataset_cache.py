"""Shuffled epochs through a real mount with `--cache-policy dataset`.

Every file is read through the mount and its pages dropped from the page cache right after
(POSIX_FADV_DONTNEED), as a dataset far larger than memory would be, so every read reaches the
daemon and `avafs status --json` counts it as a hit or a miss.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from sample_data import payload
from support import run_avafs

from avafs.client import Client

KiB = 1024
FILE_SIZE = 64 * KiB
DISK_CACHE = 2048 * KiB
BLOCK_SIZE = 256 * KiB


def _status(mountpoint: Path) -> dict:
    return json.loads(run_avafs("status", "--json", str(mountpoint)).stdout)


def _dataset(bucket: Path, files: int) -> list[str]:
    names = [f"train/{index:04d}.bin" for index in range(files)]
    for index, name in enumerate(names):
        path = bucket / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(payload(index, FILE_SIZE))
    return names


def _read(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        data = os.read(descriptor, FILE_SIZE + 1)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)
    return data


def _epochs(mountpoint: Path, names: list[str], epochs: range) -> float:
    """Reads every file once per epoch, shuffled; checks bytes and the disk tier's caps after
    every read; returns the hit ratio of these epochs, from the status counts."""
    before = _status(mountpoint)
    client = Client(mountpoint)
    for epoch in epochs:
        order = list(range(len(names)))
        random.Random(epoch).shuffle(order)
        for index in order:
            assert _read(mountpoint / names[index]) == payload(index, FILE_SIZE)
            disk = client.status()["tiers"]["disk"]
            assert disk["used_bytes"] <= disk["capacity_bytes"] + BLOCK_SIZE
            assert disk["files"] <= disk["capacity_files"]
    after = _status(mountpoint)
    hits = sum(after["hits"].values()) - sum(before["hits"].values())
    misses = after["misses"] - before["misses"]
    assert hits + misses == len(names) * len(epochs)
    return hits / (hits + misses)


def _mount_dataset(mount, bucket: Path, policy: str, ram_cache: int = 0) -> Path:
    return mount(bucket.as_uri(), "--cache-policy", policy, "--disk-cache", str(DISK_CACHE),
                 "--block-size", str(BLOCK_SIZE), "--ram-cache", str(ram_cache), "--read-only")


def test_shuffled_epochs_over_twice_the_tier_hit_its_share(mount, local_bucket):
    names = _dataset(local_bucket, 2 * DISK_CACHE // FILE_SIZE)
    mountpoint = _mount_dataset(mount, local_bucket, "dataset")
    _epochs(mountpoint, names, range(1))
    share = DISK_CACHE / (len(names) * FILE_SIZE)
    assert _epochs(mountpoint, names, range(1, 4)) >= 0.8 * share
    status = _status(mountpoint)
    assert status["tiers"]["disk"]["policy"] == "dataset"
    on_disk = sum(path.stat().st_blocks * 512 for path in
                  (mountpoint.parent / "cache").rglob("blocks/*/*"))
    assert on_disk <= DISK_CACHE + BLOCK_SIZE


def test_a_working_set_that_fits_is_served_whole_from_the_cache(mount, local_bucket):
    names = _dataset(local_bucket, DISK_CACHE // FILE_SIZE // 2)
    mountpoint = _mount_dataset(mount, local_bucket, "dataset")
    _epochs(mountpoint, names, range(1))
    assert _epochs(mountpoint, names, range(1, 3)) == 1.0


def test_the_ram_tier_adds_a_share_the_disk_tier_does_not_hold(mount, local_bucket):
    """A dataset four times the disk tier, with a RAM tier as large: the disk tier keeps its
    high watermark's worth, and RAM's main part (half of it, to its high watermark) keeps as
    much again of other samples, so more than the disk tier's share hits."""
    names = _dataset(local_bucket, 4 * DISK_CACHE // FILE_SIZE)
    mountpoint = _mount_dataset(mount, local_bucket, "dataset", ram_cache=DISK_CACHE)
    _epochs(mountpoint, names, range(1))
    kept = 0.9 * DISK_CACHE + 0.9 * DISK_CACHE / 2
    assert _epochs(mountpoint, names, range(1, 4)) >= 0.9 * kept / (len(names) * FILE_SIZE)
    assert _status(mountpoint)["tiers"]["ram"]["policy"] == "dataset"
