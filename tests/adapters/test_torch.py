"""PyTorch datasets over local directories: splitting, shuffling, resumption, DDP.

Real DataLoader worker processes, torchdata's StatefulDataLoader, and a real two-process
torch.distributed (gloo) job. The same datasets over a real avafs mount are tested in
test_torch_mount.py.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed
import torch.multiprocessing
from adapters_testlib import (
    make_files,
    make_tar_shards,
    make_tfrecord_shards,
    sample_payload,
    write_manifest,
)
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from adapters.errors import EmptyDatasetError, ManifestError
from adapters.torch import AvaIterableDataset, AvaMapDataset

SHARD_SIZES = [7, 12, 0, 9, 5, 11, 3]  # 47 samples: uneven on purpose, one empty shard


@pytest.fixture(params=["files", "tar", "tfrecord"])
def sharded_tree(request, tmp_path) -> tuple[str, Path, list[str]]:
    """(format, directory, every sample key) for each sample format."""
    root = tmp_path / request.param
    if request.param == "files":
        keys = make_files(root, 47)
    elif request.param == "tar":
        keys = make_tar_shards(root, SHARD_SIZES)
    else:
        make_tfrecord_shards(root, SHARD_SIZES)
        keys = [f"shard-{shard:04d}.tfrecord:{index}"
                for shard, size in enumerate(SHARD_SIZES) for index in range(size)]
    return request.param, root, keys


def keys_of(loader) -> list[str]:
    return [key for batch in loader for key in batch["__key__"]]


def test_map_dataset_from_manifest_with_labels(tmp_path):
    make_files(tmp_path / "data", 8)
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"path": f"class{index % 4}/img{index:05d}.bin", "label": index % 2} for index in range(8)])
    dataset = AvaMapDataset.from_manifest(
        manifest, lambda sample: (sample["data"], sample["label"]), root=tmp_path / "data",
        require_mount=False)
    assert len(dataset) == 8
    batches = list(DataLoader(dataset, batch_size=3, num_workers=2,
                              collate_fn=lambda batch: batch))
    assert [sample for batch in batches for sample in batch] == [
        (sample_payload(index), index % 2) for index in range(8)]


def test_manifest_errors_surface_through_the_dataset(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "a"}\n{"path": \n')
    dataset = AvaMapDataset.from_manifest(manifest, root=tmp_path, require_mount=False)
    with pytest.raises(ManifestError, match=r"m.jsonl:2: not valid JSON"):
        len(dataset)
    (tmp_path / "empty").mkdir()
    empty = AvaIterableDataset.from_prefix(tmp_path / "empty", require_mount=False)
    with pytest.raises(EmptyDatasetError, match="has no samples"):
        next(iter(empty))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_reads_every_sample_of_every_format(sharded_tree, num_workers):
    fmt, root, keys = sharded_tree
    dataset = AvaIterableDataset.from_prefix(root, format=fmt, require_mount=False)
    assert sorted(keys_of(DataLoader(dataset, batch_size=4, num_workers=num_workers))) == sorted(keys)


def test_ranks_get_equal_disjoint_shares(sharded_tree):
    fmt, root, keys = sharded_tree
    shares = []
    for rank in range(3):
        dataset = AvaIterableDataset.from_prefix(root, format=fmt, shuffle=True, seed=7,
                                                 shuffle_block_size=5, world_size=3, rank=rank,
                                                 require_mount=False)
        shares.append(keys_of(DataLoader(dataset, batch_size=4, num_workers=2)))
        assert len(dataset) == 16
    assert [len(share) for share in shares] == [16, 16, 16]  # 47 samples and 1 of padding
    everything = Counter(itertools.chain(*shares))
    assert set(everything) == set(keys)
    assert sum(count - 1 for count in everything.values()) == 48 - len(keys)

    dropped = [keys_of(DataLoader(AvaIterableDataset.from_prefix(
        root, format=fmt, shuffle=True, seed=7, drop_last=True, world_size=3, rank=rank,
        require_mount=False), batch_size=4)) for rank in range(3)]
    assert [len(share) for share in dropped] == [15, 15, 15]
    assert len(set(itertools.chain(*dropped))) == 45


def test_shuffle_is_seeded_and_changes_with_the_epoch(tmp_path):
    root = tmp_path / "tar"
    keys = make_tar_shards(root, SHARD_SIZES)

    def order(seed: int, epoch: int) -> list[str]:
        dataset = AvaIterableDataset.from_prefix(root, format="tar", shuffle=True, seed=seed,
                                                 shuffle_block_size=8, require_mount=False)
        dataset.set_epoch(epoch)
        return [sample["__key__"] for sample in dataset]

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)
    assert sorted(order(1, 1)) == sorted(keys) and order(1, 0) != keys


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(tmp_path, context):
    root = tmp_path / "files"
    keys = make_files(root, 47)

    def dataset() -> AvaIterableDataset:
        return AvaIterableDataset.from_prefix(root, shuffle=True, seed=5, require_mount=False)

    persistent = dataset()
    loader = DataLoader(persistent, batch_size=4, num_workers=2, persistent_workers=True,
                        multiprocessing_context=context)
    orders = []
    for epoch in (0, 1, 1, 2):
        persistent.set_epoch(epoch)
        fresh = dataset()
        fresh.set_epoch(epoch)
        orders.append(keys_of(loader))
        assert orders[-1] == keys_of(DataLoader(fresh, batch_size=4, num_workers=2))
    assert sorted(orders[0]) == sorted(keys)
    assert orders[0] != orders[1] == orders[2] != orders[3]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_yields_exactly_the_samples_not_yet_consumed(tmp_path, num_workers):
    root = tmp_path / "tar"
    make_tar_shards(root, [13, 8, 21, 6, 17])

    def loader() -> StatefulDataLoader:
        dataset = AvaIterableDataset.from_prefix(root, format="tar", shuffle=True, seed=3,
                                                 shuffle_block_size=6, require_mount=False)
        dataset.set_epoch(2)
        return StatefulDataLoader(dataset, batch_size=4, num_workers=num_workers,
                                  prefetch_factor=4 if num_workers else None)

    full = keys_of(loader())
    interrupted = loader()
    batches = iter(interrupted)
    consumed = [key for batch in itertools.islice(batches, 5) for key in batch["__key__"]]
    state = interrupted.state_dict()  # workers have produced more than this by now
    del batches, interrupted

    resumed = loader()
    resumed.load_state_dict(state)
    rest = keys_of(resumed)
    assert len(consumed) == 20
    assert sorted(consumed + rest) == sorted(full)
    if num_workers == 0:
        assert consumed + rest == full


def test_persistent_workers_resume_mid_epoch_then_follow_the_next_epoch(tmp_path):
    root = tmp_path / "tar"
    make_tar_shards(root, [13, 8, 21, 6, 17])

    def loader(epoch: int) -> tuple[AvaIterableDataset, StatefulDataLoader]:
        dataset = AvaIterableDataset.from_prefix(root, format="tar", shuffle=True, seed=3,
                                                 shuffle_block_size=6, require_mount=False)
        dataset.set_epoch(epoch)
        return dataset, StatefulDataLoader(dataset, batch_size=4, num_workers=2,
                                           persistent_workers=True, prefetch_factor=4)

    interrupted = loader(2)[1]
    batches = iter(interrupted)
    consumed = [key for batch in itertools.islice(batches, 5) for key in batch["__key__"]]
    state = interrupted.state_dict()
    del batches, interrupted

    dataset, resumed = loader(2)
    resumed.load_state_dict(state)  # the workers load it, and with it the epoch they share
    rest = keys_of(resumed)
    assert sorted(consumed + rest) == sorted(keys_of(loader(2)[1]))
    dataset.set_epoch(3)
    assert keys_of(resumed) == keys_of(loader(3)[1])


def _ddp_rank(rank: int, port: int, root: str, result_dir: str) -> None:
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        dataset = AvaIterableDataset.from_prefix(root, format="tar", shuffle=True, seed=5,
                                                 require_mount=False)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        keys = []
        for batch in DataLoader(dataset, batch_size=4, num_workers=2):
            keys.extend(batch["__key__"])
            features = torch.tensor([[len(data) / 100.0] for data in batch["bin"]])
            labels = torch.tensor([int(label) for label in batch["cls"]])
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(features), labels).backward()  # all-reduce
            optimizer.step()
        # Each rank writes its own share: a final all_gather_object would leave gloo's worker
        # thread freeing Python-owned tensors while the interpreter exits, which aborts the
        # process now and then ("terminate called without an active exception").
        Path(result_dir, f"keys-{rank}.txt").write_text(",".join(keys))
    finally:
        torch.distributed.destroy_process_group()


def test_two_process_gloo_job_gets_disjoint_equal_shares(tmp_path):
    root = tmp_path / "tar"
    keys = make_tar_shards(root, [10, 6, 9, 7])  # 32 samples over 2 ranks
    # The rendezvous store listens on a port it already holds, so no other process can take it
    # between choosing a free port and the ranks starting.
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.multiprocessing.spawn(_ddp_rank, args=(store.port, str(root), str(tmp_path)),
                                nprocs=2, join=True)
    shares = [(tmp_path / f"keys-{rank}.txt").read_text().split(",") for rank in range(2)]
    assert [len(share) for share in shares] == [16, 16]
    assert set(shares[0]).isdisjoint(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(keys)
