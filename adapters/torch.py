"""PyTorch datasets over avafs mounts: map-style, iterable with static splitting, and elastic.

Samples are dicts: `{"__key__", "__path__", "data": bytes, **labels}` for one-file samples,
`{"__key__", "__shard__", EXT: bytes, ...}` for tar shards (WebDataset's layout), and
`{"__key__", "__shard__", "data": record}` for TFRecord shards. `transform` maps that dict to
whatever the model takes. The default `collate_fn` batches such dicts into dicts of lists/tensors.

Resuming "after the last sample consumed, not produced": the iteration order is arithmetic
(`splitting.py`), so a reader's state is a single count of samples it has handed out. The count
goes up as a sample leaves the iterator, never for samples read ahead into a shuffle block.
torchdata's StatefulDataLoader calls `state_dict()` inside each worker right after the worker
built a batch and ships that state with the batch; the loader's own `state_dict()` returns the
states that came with the last batch the training loop received. Batches still queued in the
loader's prefetch are therefore not counted as consumed, and `load_state_dict` resumes each worker
exactly after the last sample of the last delivered batch.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed
import torch.utils.data

from adapters.cache_order import CachedMask, cached_mask, windows
from adapters.elastic import acknowledged_epoch, worker_identity
from adapters.mounts import check_snapshot, client_for, manifest_root, same_snapshot
from adapters.prefetch import MountHints
from adapters.reading import SampleReader
from adapters.sharding import CoordinatorClient
from adapters.shards import Sample, SampleFormat, read_file_sample, read_file_samples
from adapters.sources import ItemSource, ManifestSource, PrefixSource
from adapters.splitting import ReaderSlot, unit_order

if TYPE_CHECKING:
    from avafs.client import Client

Transform = Callable[[Sample], Any]
_UNRESOLVED = object()
"""A map dataset's mount client before its first batch looked it up (None: not on a mount)."""


class AvaMapDataset(torch.utils.data.Dataset):
    """Random access to one-file samples, for any sampler (DistributedSampler included)."""

    def __init__(self, source: ItemSource, transform: Transform | None = None, *,
                 require_mount: bool = True, snapshot: str | None = None) -> None:
        if snapshot is not None:
            check_snapshot(source.root, snapshot)
        elif require_mount:
            client_for(source.root, require_mount=True)
        self.source = source
        self.transform = transform
        self.snapshot = snapshot
        """The snapshot the samples are read from (None: the source as it is); its state
        records it, so a run resumes only on the same data."""
        self._client: Client | None | object = _UNRESOLVED

    @classmethod
    def from_prefix(cls, path: str | os.PathLike[str], transform: Transform | None = None, *,
                    suffixes: Sequence[str] = (), require_mount: bool = True,
                    snapshot: str | None = None) -> AvaMapDataset:
        return cls(PrefixSource(path, suffixes), transform, require_mount=require_mount,
                   snapshot=snapshot)

    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike[str], transform: Transform | None = None,
                      *, root: str | os.PathLike[str] | None = None,
                      url_roots: Mapping[str, str | os.PathLike[str]] | None = None,
                      require_mount: bool = True,
                      snapshot: str | None = None) -> AvaMapDataset:
        source = ManifestSource(manifest, manifest_root(manifest, root), url_roots)
        return cls(source, transform, require_mount=require_mount, snapshot=snapshot)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run must read the same: the snapshot (torchdata's `Stateful`)."""
        return {"snapshot": self.snapshot}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        same_snapshot(state, self.snapshot)

    def __len__(self) -> int:
        return len(self.source.items())

    def __getitem__(self, index: int) -> Any:
        sample = read_file_sample(self.source.items()[index])
        return sample if self.transform is None else self.transform(sample)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A DataLoader batch at once (torch calls this when a dataset has it), read through
        the mount's daemon in a few requests instead of four FUSE round trips per file."""
        if self._client is _UNRESOLVED:
            self._client = client_for(self.source.root, require_mount=False)
        items = self.source.items()
        samples = read_file_samples([items[index] for index in indices], self._client)
        if self.transform is None:
            return list(samples)
        return [self.transform(sample) for sample in samples]


class PrefetchingSampler(torch.utils.data.Sampler[int]):
    """Wraps the sampler of an AvaMapDataset and hints the mount with the next `ahead` files.

    The sampler runs in the training process, ahead of the DataLoader workers, so it is the one
    place that knows a map-style dataset's future order. Hints go out `ahead / 2` at a time.
    """

    def __init__(self, dataset: AvaMapDataset, sampler: torch.utils.data.Sampler[int],
                 ahead: int) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.ahead = ahead

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Forwards to the wrapped sampler (DistributedSampler needs it every epoch)."""
        self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[int]:
        client = client_for(self.dataset.source.root, require_mount=False)
        hints = None if client is None else MountHints(client)
        items = self.dataset.source.items()
        indices = iter(self.sampler)
        window: deque[int] = deque()
        unhinted: list[str] = []
        exhausted = False
        while True:
            while not exhausted and len(window) <= self.ahead:
                index = next(indices, None)
                if index is None:
                    exhausted = True
                else:
                    window.append(index)
                    unhinted.append(items[index].path)
            if not window:
                return
            if hints is not None and unhinted and (len(unhinted) >= self.ahead // 2 or exhausted):
                hints.send(unhinted)
                unhinted = []
            yield window.popleft()


class AvaShuffleSampler(torch.utils.data.Sampler[int]):
    """Shuffled epochs of an AvaMapDataset, a pure function of (seed, epoch), resumable.

    With `cache_aware=True`, each window of `shuffle_window` indices yields the samples the
    mount cached at the epoch's start first and hints the mount to fetch the window's others
    (`cache_order.py`). Stateful (torchdata's StatefulDataLoader saves and restores it): the
    state holds the epoch, the indices handed out and what was cached at the epoch's start, so
    a restored sampler goes on with the same order. Call `set_epoch` before each epoch; an
    iteration left unfinished is continued by the next one in the same epoch, as a restored
    sampler's is.
    """

    def __init__(self, dataset: AvaMapDataset, *, seed: int = 0, shuffle_window: int = 1000,
                 cache_aware: bool = False) -> None:
        if shuffle_window < 1:
            raise ValueError("shuffle_window must be >= 1")
        self.dataset = dataset
        self.seed = seed
        self.shuffle_window = shuffle_window
        self.cache_aware = cache_aware
        self.epoch = 0
        self._yielded = 0
        self._cached: CachedMask | None = None
        """What was cached at this epoch's start; None until the epoch starts."""

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._yielded = 0
            self._cached = None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seed": self.seed, "yielded": self._yielded,
                "cached": self._cached}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this sampler has "
                             f"seed {self.seed}")
        self.epoch, self._yielded, self._cached = state["epoch"], state["yielded"], state["cached"]

    def __iter__(self) -> Iterator[int]:
        items = self.dataset.source.items()
        order = unit_order(len(items), shuffle=True, seed=self.seed, epoch=self.epoch)
        client = client_for(self.dataset.source.root, require_mount=False)
        if self._yielded == 0 or self._cached is None:
            self._cached = (cached_mask(client, [items[index].path for index in order])
                            if self.cache_aware else 0)
        hints = MountHints(client) if client is not None and self.cache_aware else None
        for read, fetch in windows(len(order), self.shuffle_window, self._cached, self._yielded):
            if hints is not None and fetch:
                hints.send([items[order[position]].path for position in fetch])
            for position in read:
                self._yielded += 1
                yield order[position]
        self._yielded = 0
        self._cached = None


class AvaIterableDataset(torch.utils.data.IterableDataset):
    """Streams samples of files or shards, split across ranks and DataLoader workers.

    Static mode (default): each rank reads an equal, contiguous share of the epoch order; workers
    split their rank's share. Dynamic mode (`coordinator=`): trainers lease tasks from a sharding
    coordinator; iterate with `dataset.acknowledged(loader)` so tasks are acknowledged once
    consumed, and the epoch runs until every task is acknowledged by some trainer.

    `cache_aware=True` (static mode, shuffled one-file samples): each window of
    `shuffle_block_size` samples reads the ones the mount cached first while the mount fetches
    the others (`cache_order.py`); the saved state carries what was cached at the epoch's start.
    """

    def __init__(self, source: ItemSource, *, format: str | SampleFormat = SampleFormat.FILES,
                 transform: Transform | None = None, shuffle: bool = False, seed: int = 0,
                 shuffle_block_size: int = 1000, drop_last: bool = False, prefetch_ahead: int = 0,
                 require_mount: bool = True, world_size: int | None = None,
                 rank: int | None = None, coordinator: CoordinatorClient | None = None,
                 task_size: int | None = None, cache_aware: bool = False,
                 snapshot: str | None = None) -> None:
        if snapshot is not None:
            check_snapshot(source.root, snapshot)
        elif require_mount:
            client_for(source.root, require_mount=True)
        self.snapshot = snapshot
        """The snapshot the samples are read from (None: the source as it is), in the state."""
        if (world_size is None) != (rank is None):
            raise ValueError("pass both world_size and rank, or neither (torch.distributed decides)")
        if cache_aware and coordinator is not None:
            raise ValueError("cache_aware=True orders static splits; a coordinator's tasks "
                             "keep their order")
        fmt = SampleFormat(format)
        self.reader = SampleReader(source, fmt, shuffle=shuffle, seed=seed,
                                   shuffle_block_size=shuffle_block_size, drop_last=drop_last,
                                   prefetch_ahead=prefetch_ahead, cache_aware=cache_aware)
        self.transform = transform
        self.world_size = world_size
        self.rank = rank
        self.coordinator = coordinator
        self.task_size = task_size or (1 if fmt.is_sharded else 100)
        self.epoch = 0
        self._epoch_set = torch.zeros((), dtype=torch.int64).share_memory_()
        """The epoch `set_epoch` chose, in memory shared with this dataset's DataLoader workers
        (a torch tensor travels as shared memory to forked and spawned workers alike, and is
        copied by `pickle` and `deepcopy`): persistent workers take it up at their next
        iteration."""
        self._consumed = 0
        self._resume_at = 0
        self._resume_slot: ReaderSlot | None = None
        self._slot: ReaderSlot | None = None
        self._cached: CachedMask = 0
        """cache_aware: which of this reader's samples were cached as its epoch began."""
        self._consumer = worker_identity()

    @classmethod
    def from_prefix(cls, path: str | os.PathLike[str], *,
                    format: str | SampleFormat = SampleFormat.FILES,
                    suffixes: Sequence[str] | None = None, **options: Any) -> AvaIterableDataset:
        """Every file under `path` (shards: every file with the format's suffix, by default)."""
        fmt = SampleFormat(format)
        source = PrefixSource(path, fmt.default_suffixes if suffixes is None else suffixes)
        return cls(source, format=fmt, **options)

    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike[str], *,
                      root: str | os.PathLike[str] | None = None,
                      url_roots: Mapping[str, str | os.PathLike[str]] | None = None,
                      **options: Any) -> AvaIterableDataset:
        """The files (or shards, with `format=`) a JSONL manifest lists, labels attached."""
        source = ManifestSource(manifest, manifest_root(manifest, root), url_roots)
        return cls(source, **options)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order; call before iterating each epoch, as with DistributedSampler.

        Reaches the DataLoader's workers too, persistent ones included, at their next iteration.
        """
        self._epoch_set.fill_(epoch)
        self._follow_epoch(epoch)

    def _follow_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._consumed = self._resume_at = 0

    def state_dict(self) -> dict[str, Any]:
        slot = self._slot
        return {"epoch": self.epoch, "seed": self.reader.seed, "consumed": self._consumed,
                "slot": None if slot is None else [slot.world_size, slot.rank, slot.num_workers,
                                                   slot.worker],
                "cached": self._cached, "snapshot": self.snapshot}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        same_snapshot(state, self.snapshot)
        if state["seed"] != self.reader.seed:
            raise ValueError(f"state was saved with seed {state['seed']}, this dataset has "
                             f"seed {self.reader.seed}")
        self.epoch = state["epoch"]
        self._epoch_set.fill_(self.epoch)
        self._consumed = self._resume_at = state["consumed"]
        self._resume_slot = None if state["slot"] is None else ReaderSlot(*state["slot"])
        self._cached = state.get("cached", 0)

    def __len__(self) -> int:
        """Samples this rank reads per epoch (static mode), the same on every rank."""
        if self.coordinator is not None:
            raise TypeError("a dynamic dataset has no fixed length: trainers share tasks as they go")
        return self.reader.span_length(*self._rank())

    def __iter__(self) -> Iterator[Any]:
        self._follow_epoch(int(self._epoch_set))
        slot = self._current_slot()
        skip, self._resume_at = self._resume_at, 0
        if skip and self._resume_slot not in (None, slot):
            raise ValueError(f"state was saved by reader {self._resume_slot} but this reader is "
                             f"{slot}: resume with the same world size and num_workers")
        self._slot = slot
        self._consumed = skip
        if self.coordinator is not None:
            worker = f"{self._consumer}/rank{slot.rank}/worker{slot.worker}"
            samples = self.reader.dynamic_samples(self.coordinator, self.epoch, worker,
                                                  self.task_size)
        else:
            if self.reader.cache_aware and not skip:
                self._cached = self.reader.cached_at_start(slot, self.epoch)
            samples = self.reader.static_samples(slot, self.epoch, skip, self._cached)
        for sample in samples:
            self._consumed += 1
            yield sample if self.transform is None else self._transformed(sample)

    def acknowledged(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterates `loader` over this dataset until the coordinator's epoch is complete.

        Each task is acknowledged after the training step that consumed its last sample, i.e.
        when the loop asks for the next batch. Tasks other trainers held when they died are picked
        up in further passes, so one call runs one whole epoch of the job.
        """
        if self.coordinator is None:
            raise ValueError("acknowledged() needs a dataset made with coordinator=")
        if getattr(loader, "drop_last", False):
            raise ValueError("drop_last=True would drop the end of a task, which then never "
                             "completes; use drop_last=False with dynamic sharding")
        return acknowledged_epoch(self.coordinator, self.epoch, lambda: loader, _lease_tags)

    def _transformed(self, sample: Sample) -> Any:
        assert self.transform is not None
        result = self.transform(sample)
        if "__lease__" not in sample:
            return result
        if not isinstance(result, dict):
            raise TypeError("with a coordinator, transform must return a dict so each sample "
                            f"keeps its '__lease__' tag; it returned {type(result).__name__}")
        return {**result, "__lease__": sample["__lease__"]}

    def __getstate__(self) -> dict[str, Any]:
        """Pins this process's rank into the copy sent to a spawned DataLoader worker.

        A worker started with spawn or forkserver (the default inside `torch.multiprocessing.spawn`
        ranks) has no process group, so it could not ask torch.distributed which rank it serves.
        """
        state = self.__dict__.copy()
        if state["world_size"] is None and torch.distributed.is_available() \
                and torch.distributed.is_initialized():
            state["world_size"], state["rank"] = self._rank()
        return state

    def _rank(self) -> tuple[int, int]:
        if self.world_size is not None and self.rank is not None:
            return self.world_size, self.rank
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def _current_slot(self) -> ReaderSlot:
        world_size, rank = self._rank()
        info = torch.utils.data.get_worker_info()
        if info is None:
            return ReaderSlot(world_size, rank)
        return ReaderSlot(world_size, rank, info.num_workers, info.id)

def _lease_tags(batch: Any) -> Iterable[str | bytes]:
    if isinstance(batch, Mapping):
        return batch["__lease__"]
    return [sample["__lease__"] for sample in batch]
