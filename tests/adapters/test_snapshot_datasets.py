"""Datasets that read a snapshot (README, "Snapshots"): the sample list is the snapshot's,
whatever the bucket holds now; a dataset refuses a mount that serves other data; the resume
state (the PyTorch datasets' state, the TF `ResumeCheckpoint`) names the snapshot and refuses
to resume on other data."""

from __future__ import annotations

import pytest
from support import run_avafs
from torch.utils.data import DataLoader

from adapters.torch import AvaIterableDataset, AvaMapDataset


def test_a_snapshot_mount_gives_the_recorded_samples_and_the_state_names_it(local_bucket,
                                                                            mount, tmp_path):
    (local_bucket / "train").mkdir()
    for index in range(6):
        (local_bucket / "train" / f"{index}.bin").write_bytes(bytes([index]) * 100)
    assert run_avafs("snapshot", "create", local_bucket.as_uri(), "v1").returncode == 0
    snap = mount(local_bucket.as_uri(), "--snapshot", "v1", mountpoint=tmp_path / "snap",
                 cache_dir=tmp_path / "cache")
    warmed = run_avafs("warmup", "--snapshot", "v1", "--mount", str(snap))
    assert warmed.returncode == 0, warmed.stderr
    (local_bucket / "train" / "6.bin").write_bytes(b"added after the snapshot")
    (local_bucket / "train" / "0.bin").unlink()  # served from the cache: no versions here
    live = mount(local_bucket.as_uri(), "--read-only", cache_dir=tmp_path / "live-cache")
    with pytest.raises(ValueError, match="a mount of the source as it is now, not of snapshot "
                                         "'v1': mount it with 'avafs mount SOURCE MOUNTPOINT "
                                         "--snapshot v1'"):
        AvaIterableDataset.from_prefix(live / "train", snapshot="v1")

    dataset = AvaIterableDataset.from_prefix(snap / "train", snapshot="v1")
    samples = list(dataset)
    assert [sample["__key__"] for sample in samples] == [f"{index}.bin" for index in range(6)]
    assert samples[0]["data"] == bytes([0]) * 100
    state = dataset.state_dict()
    assert state["snapshot"] == "v1"
    with pytest.raises(ValueError, match="state was saved reading snapshot 'v1', this dataset "
                                         "reads the source as it was"):
        AvaIterableDataset.from_prefix(live / "train").load_state_dict(state)

    by_index = AvaMapDataset.from_prefix(snap / "train", snapshot="v1")
    keys = [sample["__key__"] for batch in DataLoader(by_index, batch_size=4, collate_fn=list)
            for sample in batch]
    assert keys == [f"{index}.bin" for index in range(6)]
    assert by_index.state_dict() == {"snapshot": "v1"}
    by_index.load_state_dict({"snapshot": "v1"})
    with pytest.raises(ValueError, match="saved reading the source as it was"):
        by_index.load_state_dict({"snapshot": None})


def test_a_tf_dataset_of_a_snapshot_lists_the_recorded_files(local_bucket, mount, tmp_path):
    tf_adapter = pytest.importorskip("adapters.tf")
    (local_bucket / "a").write_bytes(b"a")
    assert run_avafs("snapshot", "create", local_bucket.as_uri(), "v1").returncode == 0
    (local_bucket / "b").write_bytes(b"b")
    snap = mount(local_bucket.as_uri(), "--snapshot", "v1", cache_dir=tmp_path / "cache")
    elements = list(tf_adapter.dataset(snap, snapshot="v1").as_numpy_iterator())
    assert [(element["__key__"], element["data"]) for element in elements] == [(b"a", b"a")]
    with pytest.raises(ValueError, match="not of snapshot 'v2'"):
        tf_adapter.dataset(snap, snapshot="v2")

    iterator = iter(tf_adapter.dataset(snap, snapshot="v1"))
    saved = tf_adapter.ResumeCheckpoint(iterator, snapshot="v1").save(str(tmp_path / "ckpt"))
    tf_adapter.ResumeCheckpoint(iter(tf_adapter.dataset(snap, snapshot="v1")),
                                snapshot="v1").restore(saved)
    live = tf_adapter.dataset(mount(local_bucket.as_uri(), "--read-only",
                                    mountpoint=tmp_path / "live", cache_dir=tmp_path / "live-cache"))
    with pytest.raises(ValueError, match="state was saved reading snapshot 'v1', this dataset "
                                         "reads the source as it was"):
        tf_adapter.ResumeCheckpoint(iter(live)).restore(saved)
