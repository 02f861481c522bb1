"""PyTorch datasets over a real avafs mount of a bucket on the S3 test server.

Covers what only a mount shows: DataLoader workers reading through FUSE, prefetch hints that
make the mount fetch the next items before the dataset reads them, the clear error for a path
outside any mount, and a model trained on data read through the mount.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from adapters_testlib import make_files, make_tar_shards, sample_payload, write_vector_samples
from torch.utils.data import DataLoader, SequentialSampler

from adapters.shards import FILE_BATCH
from adapters.torch import AvaIterableDataset, AvaMapDataset, PrefetchingSampler
from avafs.client import Client, NotAnAvafsMount


def object_gets(s3_server, bucket: str) -> list[str]:
    """Keys the S3 server has served with GET (not LIST), in request order."""
    prefix = f"GET /{bucket}/"
    return [line.split()[1].split("?")[0][len(prefix) - 4:]
            for line in s3_server.requests()
            if line.startswith(prefix) and "list-type" not in line]


def wait_for_prefetched(client: Client, count: int) -> None:
    deadline = time.monotonic() + 30
    while client.status()["prefetch"]["done"] < count:
        assert time.monotonic() < deadline, client.status()["prefetch"]
        time.sleep(0.05)


@pytest.mark.parametrize("num_workers", [0, 4])
def test_dataloader_reads_every_file_through_the_mount(tmp_path, mounted_bucket, num_workers):
    keys = make_files(tmp_path / "tree" / "train", 64)
    mnt = mounted_bucket(tmp_path / "tree")
    dataset = AvaIterableDataset.from_prefix(mnt / "train", shuffle=True, seed=3,
                                             prefetch_ahead=16)
    got = {key: data for batch in DataLoader(dataset, batch_size=8, num_workers=num_workers)
           for key, data in zip(batch["__key__"], batch["data"], strict=True)}
    assert got == {key: sample_payload(int(key[-9:-4])) for key in keys}

    by_index = AvaMapDataset.from_prefix(mnt / "train")
    loaded = [sample for batch in DataLoader(by_index, batch_size=8, num_workers=num_workers,
                                             collate_fn=list) for sample in batch]
    assert [sample["__key__"] for sample in loaded] == keys


def test_tar_shards_stream_through_the_mount(tmp_path, mounted_bucket):
    keys = make_tar_shards(tmp_path / "tree" / "shards", [30, 25, 40, 5])
    mnt = mounted_bucket(tmp_path / "tree")
    dataset = AvaIterableDataset.from_prefix(mnt / "shards", format="tar", shuffle=True, seed=1,
                                             shuffle_block_size=16, prefetch_ahead=2)
    samples = [sample for batch in DataLoader(dataset, batch_size=10, num_workers=2,
                                              collate_fn=list) for sample in batch]
    assert sorted(sample["__key__"] for sample in samples) == sorted(keys)
    assert all(sample["bin"] == sample_payload(int(sample["__key__"][1:])) for sample in samples)


def test_prefetch_hints_fetch_the_next_items_before_they_are_read(tmp_path, mounted_bucket,
                                                                   s3_server, bucket):
    keys = make_files(tmp_path / "tree", 2 * FILE_BATCH + 16)
    mnt = mounted_bucket(tmp_path / "tree")
    client = Client.for_path(mnt)
    samples = iter(AvaIterableDataset.from_prefix(mnt, prefetch_ahead=8))
    assert next(samples)["__key__"] == keys[0]  # reads the first batch of files in one request

    wait_for_prefetched(client, 8)
    fetched = object_gets(s3_server, bucket)
    upcoming = keys[FILE_BATCH:FILE_BATCH + 8]
    assert set(upcoming) <= set(fetched)  # the 8 after the batch, before the dataset read them
    assert not set(keys[FILE_BATCH + 8:]) & set(fetched)  # and nothing beyond the window
    read = [next(samples) for _ in range(FILE_BATCH + 7)][-8:]
    assert [sample["data"] for sample in read] == [sample_payload(int(key[-9:-4]))
                                                  for key in upcoming]
    assert sorted(key for key in object_gets(s3_server, bucket) if key in upcoming) \
        == sorted(upcoming)  # reading them fetched nothing again


def test_prefetching_sampler_hints_a_map_style_dataset(tmp_path, mounted_bucket, s3_server,
                                                       bucket):
    keys = make_files(tmp_path / "tree", 30)
    mnt = mounted_bucket(tmp_path / "tree")
    dataset = AvaMapDataset.from_prefix(mnt)
    indices = iter(PrefetchingSampler(dataset, SequentialSampler(dataset), ahead=6))
    assert next(indices) == 0
    wait_for_prefetched(Client.for_path(mnt), 7)  # the index handed out and the 6 after it
    assert set(keys[:7]) <= set(object_gets(s3_server, bucket))
    assert list(indices) == list(range(1, 30))


def test_paths_outside_a_mount_are_a_clear_error(tmp_path, mounted_bucket):
    make_files(tmp_path / "local", 3)
    with pytest.raises(NotAnAvafsMount, match=r"is not inside an avafs mount.*require_mount=False"):
        AvaMapDataset.from_prefix(tmp_path / "local")
    with pytest.raises(NotAnAvafsMount, match="is not inside an avafs mount"):
        AvaIterableDataset.from_prefix(tmp_path / "local", format="tar")
    (tmp_path / "local.jsonl").write_text('{"path": "class0/img00000.bin"}\n')
    with pytest.raises(ValueError, match="local.jsonl is not inside an avafs mount: pass root="):
        AvaMapDataset.from_manifest(tmp_path / "local.jsonl", require_mount=False)
    assert len(AvaMapDataset.from_prefix(tmp_path / "local", require_mount=False)) == 3


def test_tiny_model_trains_one_epoch_on_data_read_through_the_mount(tmp_path, mounted_bucket):
    write_vector_samples(tmp_path / "tree", 512)
    mnt = mounted_bucket(tmp_path / "tree")

    def to_tensors(sample):
        return torch.from_numpy(np.frombuffer(sample["data"], np.float32).copy()), sample["label"]

    dataset = AvaMapDataset.from_manifest(mnt / "vectors.jsonl", to_tensors)  # root: the mount
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def mean_loss() -> float:
        with torch.no_grad():
            features, labels = next(iter(DataLoader(dataset, batch_size=len(dataset))))
            return torch.nn.functional.cross_entropy(model(features), labels).item()

    before = mean_loss()
    for features, labels in DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(features), labels).backward()
        optimizer.step()
    assert mean_loss() < before * 0.7
