"""TensorFlow adapter: native pipelines, sharding by InputContext, checkpoints, Keras, dynamic mode.

Every TensorFlow test lives in this one module: importing TensorFlow is slow, and the two
logical CPU devices that MirroredStrategy needs must be configured before any TF op runs.
"""

from __future__ import annotations

import pytest
import tensorflow as tf
from adapters_testlib import (
    make_files,
    make_tfrecord_shards,
    sample_payload,
    write_manifest,
    write_vector_samples,
)

import adapters.tf as ava_tf
from adapters.sharding import CoordinatorClient
from adapters.shards import FILE_BATCH, SampleFormat, read_samples
from adapters.sources import Item
from avafs.client import Client

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)

SHARD_SIZES = [9, 4, 0, 12, 6]


def test_files_with_manifest_labels_equal_the_source(tmp_path):
    make_files(tmp_path / "data", 30)
    manifest = write_manifest(tmp_path / "train.jsonl", [
        {"path": f"class{index % 4}/img{index:05d}.bin", "label": index % 3}
        for index in range(30)])
    elements = ava_tf.dataset(manifest=manifest, root=tmp_path / "data", shuffle=True, seed=1,
                              require_mount=False)
    got = {element["__key__"].numpy().decode(): (element["data"].numpy(),
                                                  int(element["label"].numpy()))
           for element in elements}
    assert got == {f"class{index % 4}/img{index:05d}.bin": (sample_payload(index), index % 3)
                   for index in range(30)}


def test_tfrecord_shards_equal_the_source_in_both_directions(tmp_path):
    records = make_tfrecord_shards(tmp_path / "shards", SHARD_SIZES)
    elements = ava_tf.dataset(tmp_path / "shards", format="tfrecord", require_mount=False)
    assert sorted(record.numpy() for record in elements) == sorted(records)

    with tf.io.TFRecordWriter(str(tmp_path / "by-tf.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    shard = Item(str(tmp_path / "by-tf.tfrecord"), "by-tf.tfrecord")
    assert [sample["data"] for sample in read_samples(SampleFormat.TFRECORD, shard)] == records


@pytest.mark.parametrize("fmt", ["files", "tfrecord"])
def test_input_pipelines_read_disjoint_shares(tmp_path, fmt):
    if fmt == "files":
        make_files(tmp_path / "data", 25)
    else:
        make_tfrecord_shards(tmp_path / "data", SHARD_SIZES)
    shares = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=2)
        elements = ava_tf.dataset(tmp_path / "data", format=fmt, shuffle=True, seed=4,
                                  input_context=context, require_mount=False)
        shares.append([(element if fmt == "tfrecord" else element["data"]).numpy()
                       for element in elements])
    assert set(shares[0]).isdisjoint(shares[1])
    assert len(shares[0]) + len(shares[1]) == (25 if fmt == "files" else sum(SHARD_SIZES))
    assert shares[0] and shares[1]


def test_distribute_datasets_from_function_feeds_every_replica(tmp_path):
    keys = make_files(tmp_path / "data", 32)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    distributed = strategy.distribute_datasets_from_function(
        ava_tf.dataset_fn(tmp_path / "data", global_batch_size=8, shuffle=True, seed=2,
                          require_mount=False))
    seen = []
    for batch in distributed:
        per_replica = strategy.experimental_local_results(batch["__key__"])
        assert [len(keys) for keys in per_replica] == [4, 4]
        seen.extend(key.decode() for keys in per_replica for key in keys.numpy())
    assert sorted(seen) == keys


@pytest.mark.parametrize("fmt", ["files", "tfrecord"])
def test_iterator_checkpoint_resumes_where_it_stopped(tmp_path, fmt):
    if fmt == "files":
        make_files(tmp_path / "data", 40)
    else:
        make_tfrecord_shards(tmp_path / "data", SHARD_SIZES)
    elements = ava_tf.dataset(tmp_path / "data", format=fmt, shuffle=True, seed=9, batch_size=3,
                              require_mount=False)

    def key(batch) -> list[bytes]:
        return list((batch if fmt == "tfrecord" else batch["data"]).numpy())

    iterator = iter(elements)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    consumed = [key(next(iterator)) for _ in range(4)]
    saved = checkpoint.save(str(tmp_path / "ckpt" / "it"))
    rest = [key(batch) for batch in iterator]
    checkpoint.restore(saved)
    assert [key(batch) for batch in iterator] == rest
    everything = [record for batch in consumed + rest for record in batch]
    assert len(everything) == len(set(everything)) == (40 if fmt == "files" else sum(SHARD_SIZES))


def test_refuses_tar_and_ambiguous_sources(tmp_path):
    with pytest.raises(ValueError, match="tar shards are read by adapters.torch"):
        ava_tf.dataset(tmp_path, format="tar", require_mount=False)
    with pytest.raises(ValueError, match="either a directory path or manifest="):
        ava_tf.dataset(tmp_path, manifest=tmp_path / "m.jsonl", require_mount=False)


def test_dynamic_dataset_completes_an_epoch_through_the_coordinator(tmp_path, coordinator_service):
    keys = make_files(tmp_path / "data", 60)
    service = coordinator_service(str(tmp_path / "state.db"), lease_ttl=10)
    client = CoordinatorClient(service.url, "tf-job")
    elements = ava_tf.dynamic_dataset(tmp_path / "data", coordinator=client, shuffle=True,
                                      task_size=7, batch_size=5, require_mount=False)
    seen = []
    for batch in ava_tf.acknowledged(elements, client):
        seen.extend(key.decode() for key in batch["__key__"].numpy())
    assert sorted(seen) == keys
    status = client.status(0)
    assert (status["done"], status["acked_tasks"], status["acked_samples"]) == (True, 9, 60)


def test_keras_model_trains_one_epoch_on_data_read_through_the_mount(tmp_path, mounted_bucket):
    write_vector_samples(tmp_path / "tree", 512)
    mnt = mounted_bucket(tmp_path / "tree")
    source = {f"vectors/{index:05d}.bin": (tmp_path / "tree/vectors" / f"{index:05d}.bin").read_bytes()
              for index in range(512)}
    elements = ava_tf.dataset(manifest=mnt / "vectors.jsonl", shuffle=True, seed=0)  # root: mount
    assert {element["__key__"].numpy().decode(): element["data"].numpy()
            for element in elements} == source

    def features(element):
        return (tf.io.decode_raw(element["data"], tf.float32), element["label"])

    train = ava_tf.dataset(manifest=mnt / "vectors.jsonl", shuffle=True, seed=0,
                           transform=features, batch_size=32)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.evaluate(train, verbose=0)
    model.fit(train, epochs=1, verbose=0, shuffle=False)  # the dataset shuffles itself
    assert model.evaluate(train, verbose=0) < before * 0.7


def test_mount_is_read_a_batch_per_request_in_the_same_order(tmp_path, mounted_bucket,
                                                                monkeypatch):
    make_files(tmp_path / "tree", 70)
    mnt = mounted_bucket(tmp_path / "tree")
    requests = []
    read_files = Client.read_files

    def counted(client, paths):
        paths = list(paths)
        requests.append(len(paths))
        return read_files(client, paths)

    monkeypatch.setattr(Client, "read_files", counted)

    def run(root, **options):
        elements = ava_tf.dataset(root, shuffle=True, seed=3, batch_size=8, **options)
        iterator = iter(elements)
        checkpoint = tf.train.Checkpoint(iterator=iterator)
        first = [next(iterator) for _ in range(3)]
        saved = checkpoint.save(str(tmp_path / "ckpt" / root.name / "it"))
        rest = list(iterator)
        checkpoint.restore(saved)
        assert [batch["data"].numpy().tolist() for batch in iterator] == \
            [batch["data"].numpy().tolist() for batch in rest]
        return [(key.decode(), data) for batch in first + rest
                for key, data in zip(batch["__key__"].numpy(), batch["data"].numpy(),
                                     strict=True)]

    through_mount = run(mnt)
    assert sum(requests) >= 70 and max(requests) == FILE_BATCH
    assert through_mount == run(tmp_path / "tree", require_mount=False)
