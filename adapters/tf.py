"""TensorFlow datasets over avafs mounts, built from native tf.data ops.

`dataset()` lists the source once in Python (lazily, as the PyTorch side does), then everything
else is graph ops: a seeded shuffle of the file list, `shard` by `tf.distribute.InputContext`,
the reads, and `prefetch`; its iterators checkpoint with `tf.train.Checkpoint(iterator=...)`,
or with `ResumeCheckpoint`, which also records the snapshot the dataset reads.
TFRecord shards are an interleave of `TFRecordDataset` with `num_parallel_calls=AUTOTUNE`.
One-file samples are read through the mount's daemon a batch at a time where its control
socket is reachable (`read_file_samples`, as `AvaMapDataset` does: in place from the cache's
block files), since through FUSE every small file costs four round trips to the daemon; else
(a pod's view of a CSI volume, a plain directory) file by file with `tf.io.read_file`, which
runs outside the GIL. Both keep the file list's order, so shuffling, sharding and resuming
are the same either way. Elements are `{"__key__", "__path__", "data",
**labels}` for one-file samples and the serialized records themselves for TFRecord shards, as
`TFRecordDataset` yields them. Tar shards are a PyTorch (WebDataset) format and are refused here.

`dynamic_dataset()` is the elastic mode: samples of tasks leased from the sharding coordinator,
through `tf.data.Dataset.from_generator`, since leasing is a network conversation no graph op
can hold. Iterate it with `acknowledged()` so tasks are acknowledged after the step that
consumed them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from adapters.elastic import acknowledged_epoch, worker_identity
from adapters.mounts import check_snapshot, client_for, manifest_root, same_snapshot
from adapters.reading import SampleReader
from adapters.sharding import CoordinatorClient
from adapters.shards import FILE_BATCH, SampleFormat, read_file_samples
from adapters.sources import Item, ItemSource, ManifestSource, PrefixSource

if TYPE_CHECKING:
    from avafs.client import Client

AUTOTUNE = tf.data.AUTOTUNE


def dataset(path: str | os.PathLike[str] | None = None, *,
            manifest: str | os.PathLike[str] | None = None,
            root: str | os.PathLike[str] | None = None,
            url_roots: Mapping[str, str | os.PathLike[str]] | None = None,
            format: str | SampleFormat = SampleFormat.FILES,
            suffixes: Sequence[str] | None = None, shuffle: bool = False, seed: int = 0,
            input_context: tf.distribute.InputContext | None = None,
            transform: Callable[..., Any] | None = None, batch_size: int | None = None,
            drop_remainder: bool = False, cycle_length: int | None = None,
            require_mount: bool = True, snapshot: str | None = None) -> tf.data.Dataset:
    """Files under `path`, or listed in `manifest`, as a native tf.data pipeline.

    With `input_context`, each input pipeline reads a disjoint share: the file list is shuffled
    with the same seed in every pipeline, then sharded, so shares never overlap. `transform` is
    mapped in parallel before batching; `batch_size` batches before the final prefetch. With
    `snapshot`, the path must be in a mount of that snapshot (`check_snapshot`), so the file
    list is the snapshot's.
    """
    fmt, source = _source(path, manifest, root, url_roots, format, suffixes, require_mount,
                          snapshot)
    items = source.items()
    columns: dict[str, Any] = {"__key__": [item.key for item in items],
                               "__path__": [item.path for item in items]}
    columns.update(_label_columns(source))
    files = tf.data.Dataset.from_tensor_slices(columns)
    if shuffle:
        files = files.shuffle(len(items), seed=seed, reshuffle_each_iteration=True)
    if input_context is not None and input_context.num_input_pipelines > 1:
        files = files.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if fmt is SampleFormat.TFRECORD:
        samples = files.interleave(lambda row: tf.data.TFRecordDataset(row["__path__"]),
                                   cycle_length=cycle_length, num_parallel_calls=AUTOTUNE)
    else:
        samples = _with_contents(files, client_for(source.root, require_mount=False))
    if transform is not None:
        samples = samples.map(transform, num_parallel_calls=AUTOTUNE)
    if batch_size is not None:
        samples = samples.batch(batch_size, drop_remainder=drop_remainder)
    return samples.prefetch(AUTOTUNE)


_SNAPSHOT_VARIABLE = "snapshot/.ATTRIBUTES/VARIABLE_VALUE"
"""Where a `ResumeCheckpoint` keeps the snapshot's name in the checkpoint."""


class ResumeCheckpoint(tf.train.Checkpoint):
    """A `tf.train.Checkpoint` of a dataset's iterator (and whatever else is given) that also
    records which snapshot the dataset reads (`snapshot=`, None for the source as it is):
    restoring or reading a checkpoint saved on other data raises ValueError, as the PyTorch
    datasets' `load_state_dict` does, since an iterator's position means nothing over another
    file list. The name is a string variable of the checkpoint, so `save`, `write` and the
    checkpoint managers keep it without more."""

    def __init__(self, iterator: Any, snapshot: str | None = None, **trackables: Any) -> None:
        self._reads = snapshot
        super().__init__(iterator=iterator, **trackables,
                         snapshot=tf.Variable(snapshot or "", trainable=False, dtype=tf.string))

    def restore(self, save_path: str, options: Any = None) -> Any:
        self._check_snapshot(save_path)
        return super().restore(save_path, options)

    def read(self, save_path: str, options: Any = None) -> Any:
        self._check_snapshot(save_path)
        return super().read(save_path, options)

    def _check_snapshot(self, save_path: str) -> None:
        """Before anything is restored: a checkpoint without the record (a plain
        `tf.train.Checkpoint`) counts as saved reading the source as it was."""
        try:
            saved = tf.train.load_variable(save_path, _SNAPSHOT_VARIABLE).decode()
        except tf.errors.NotFoundError:
            saved = ""
        same_snapshot({"snapshot": saved or None}, self._reads)


def dataset_fn(path: str | os.PathLike[str] | None = None, *, global_batch_size: int,
               **options: Any) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """For `strategy.distribute_datasets_from_function`: one pipeline per input worker.

    Each pipeline reads its share and batches at the per-replica batch size, so a step consumes
    `global_batch_size` samples across all replicas.
    """

    def make(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return dataset(path, input_context=input_context,
                       batch_size=input_context.get_per_replica_batch_size(global_batch_size),
                       **options)

    return make


def dynamic_dataset(path: str | os.PathLike[str] | None = None, *,
                    coordinator: CoordinatorClient, epoch: int = 0,
                    manifest: str | os.PathLike[str] | None = None,
                    root: str | os.PathLike[str] | None = None,
                    url_roots: Mapping[str, str | os.PathLike[str]] | None = None,
                    format: str | SampleFormat = SampleFormat.FILES,
                    suffixes: Sequence[str] | None = None, shuffle: bool = False, seed: int = 0,
                    shuffle_block_size: int = 1000, prefetch_ahead: int = 0,
                    task_size: int | None = None, batch_size: int | None = None,
                    require_mount: bool = True) -> tf.data.Dataset:
    """Samples of tasks leased from the coordinator; every element carries `__lease__`.

    One-file samples are `{"__key__", "__path__", "data", **labels}`; TFRecord samples are
    `{"__key__", "__shard__", "data"}`. Batch with `batch_size` (not after `acknowledged`), and
    iterate with `acknowledged(ds, coordinator, epoch)`.
    """
    fmt, source = _source(path, manifest, root, url_roots, format, suffixes, require_mount)
    reader = SampleReader(source, fmt, shuffle=shuffle, seed=seed,
                          shuffle_block_size=shuffle_block_size, drop_last=False,
                          prefetch_ahead=prefetch_ahead)
    if fmt is SampleFormat.FILES:
        fields = ["__key__", "__path__", "data", "__lease__"]
        labels = {name: tf.constant(values).dtype
                  for name, values in _label_columns(source).items()}
    else:
        fields, labels = ["__key__", "__shard__", "data", "__lease__"], {}
    signature = {name: tf.TensorSpec((), tf.string) for name in fields}
    signature.update({name: tf.TensorSpec((), dtype) for name, dtype in labels.items()})
    size = task_size or (1 if fmt.is_sharded else 100)
    consumer = worker_identity()

    def samples() -> Iterator[dict[str, Any]]:
        for sample in reader.dynamic_samples(coordinator, epoch, consumer, size):
            yield {name: sample[name] for name in signature}

    elements = tf.data.Dataset.from_generator(samples, output_signature=signature)
    if batch_size is not None:
        elements = elements.batch(batch_size)
    return elements.prefetch(AUTOTUNE)


def acknowledged(elements: tf.data.Dataset, coordinator: CoordinatorClient,
                 epoch: int = 0) -> Iterator[Any]:
    """Iterates a dynamic dataset until the coordinator's epoch is complete.

    A task is acknowledged when the loop asks for the element after the one holding its last
    sample, i.e. after the training step on it; tasks of trainers that died are picked up by
    further passes over `elements`.
    """
    return acknowledged_epoch(coordinator, epoch, lambda: elements,
                              lambda element: element["__lease__"].numpy().reshape(-1).tolist())


def _source(path: str | os.PathLike[str] | None, manifest: str | os.PathLike[str] | None,
            root: str | os.PathLike[str] | None,
            url_roots: Mapping[str, str | os.PathLike[str]] | None,
            format: str | SampleFormat, suffixes: Sequence[str] | None,
            require_mount: bool, snapshot: str | None = None) -> tuple[SampleFormat, ItemSource]:
    fmt = SampleFormat(format)
    if fmt is SampleFormat.TAR:
        raise ValueError("tar shards are read by adapters.torch; TensorFlow reads files and "
                         "TFRecord shards")
    if (path is None) == (manifest is None):
        raise ValueError("pass either a directory path or manifest=, not both or neither")
    source: ItemSource
    if path is not None:
        source = PrefixSource(path, fmt.default_suffixes if suffixes is None else suffixes)
    else:
        assert manifest is not None
        source = ManifestSource(manifest, manifest_root(manifest, root), url_roots)
    if snapshot is not None:
        check_snapshot(source.root, snapshot)
    elif require_mount:
        client_for(source.root, require_mount=True)
    return fmt, source


def _with_contents(rows: tf.data.Dataset, client: Client | None) -> tf.data.Dataset:
    """Each row with its file's bytes as "data", in the rows' order.

    With a client, FILE_BATCH rows at a time go through `read_file_samples` in one
    `numpy_function` (declared stateless: it only reads files, so iterators still checkpoint),
    then are unbatched, so what follows sees the same elements as file by file.
    """
    if client is None:
        return rows.map(lambda row: {**row, "data": tf.io.read_file(row["__path__"])},
                        num_parallel_calls=AUTOTUNE)

    def read(paths: np.ndarray) -> np.ndarray:
        items = [Item(os.fsdecode(path), "") for path in paths]
        contents = np.empty(len(items), dtype=object)
        contents[:] = [sample["data"] for sample in read_file_samples(items, client)]
        return contents

    def with_data(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        data = tf.numpy_function(read, [batch["__path__"]], tf.string, stateful=False)
        data.set_shape(batch["__path__"].shape)
        return {**batch, "data": data}

    return rows.batch(FILE_BATCH).map(with_data, num_parallel_calls=AUTOTUNE).unbatch()


def _label_columns(source: ItemSource) -> dict[str, list[Any]]:
    """Manifest labels as columns; every line must carry the same label fields."""
    items = source.items()
    names = sorted(items[0].labels)
    for item in items:
        if sorted(item.labels) != names:
            raise ValueError(f"{source.describe()}: {item.key} has label fields "
                             f"{sorted(item.labels)}, the first sample has {names}; tf.data "
                             "needs the same fields on every sample")
    return {name: [item.labels[name] for item in items] for name in names}
