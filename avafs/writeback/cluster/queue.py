"""A node's queue of pending uploads kept outside the node (`--writeback cluster`).

Mechanism. Committing a file (close(), fsync()) under `--writeback cluster` stages it: the
data file goes to the cluster store as `staging/<node>/<token>` (the store replicates it),
either in one PUT or, for a file written front to back, by completing the multipart upload
that sent its parts while it was written (cluster/streams.py), then its record, naming the origin (source URL and key), the staging object, size,
mtime and attributes, is put in etcd under `/avafs/<cluster id>/queue/<node>/<id>`. An id is
`<commit time>-<token>`: ids grow with commit time, so the queue's key order is the order
files were committed, while the token, which names the staging object, can be chosen before
(when the file starts streaming). Only then is the
state journaled locally and the close acknowledged.

Invariants.
- A record is written only while this node holds its queue: the transaction that puts it
  compares the node's owner key (takeover.py) with the value this node gave it, so a node
  that lost its lease (and maybe its queue to a taker) cannot add a record that nobody would
  upload; the stage fails and the file stays node-durable.
- A record exists only once its staging object is complete; the record goes before its
  object (`settle`), so a record never names a missing object. An object without a record is
  garbage a take-over sweeps.
- A record outlives the origin's copy only briefly: it is deleted after the upload of its
  state settled (or once the state was replaced or removed, see below), never before.
- Per key the newest record wins: a take-over uploads, of a key's records, only the last.
- Every pending state is recorded, not only written files: a deletion (`deleted`), a copy
  (`copy`: a rename of a file the origin has, or a change of attributes) and a directory
  marker (`data` of size 0, no object) too, so a take-over replays the node's changes per key
  in order and leaves the origin as the node left its namespace. The states of one namespace
  change (a rename's new key and the deletion of its old one) go in one etcd transaction. A
  renamed or re-attributed file whose staged object still holds its data gets a record that
  names the same object (ids share the token), so a rename sends no data; an object goes only
  with the last record that names it.
- The cluster store and etcd are optional at any moment: a failed stage leaves the state
  node-durable (journaled locally, as under `--writeback async`), counted in `unstaged`, and
  the daemon's re-stager stages it again once both answer. After a failure, commits skip
  staging until the re-stager has staged something (or, with nothing left to stage, its
  `probe` answered), so an outage costs one commit one timeout, not one per commit or per
  pause; the status never says cluster-durable while commits still skip staging.
- Staging requests may take STAGE_TIMEOUT seconds (or `--cluster-timeout`, if longer) besides
  their transfer, not the read tier's short limit: a reader has the origin to turn to, a
  committer only node-durability, and a store busy writing (its disks, its replicas) answers
  writes late.

Threads and locks. `stage` runs in the committing thread, holding no lock. Drops run in one
background thread (`avafs-unstage`), which settles the records dropped meanwhile a batch at a
time: one etcd transaction deletes up to SETTLE_BATCH records, then one request deletes their
objects, so a queue of many small files drains in a few requests, and an unmount, which waits
for the drops, waits for those. `_lock` guards the error state and the records to settle, and
is a leaf; the write-back manager calls `drop` with `WriteBack.lock` held (it only queues).
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import quote

from ...stores.metadata import Attrs
from ..file_views import FileView
from ..pending import DATA
from .coordination import Etcd, EtcdUnavailable

if TYPE_CHECKING:  # boto3 is optional: only a cluster mount needs it
    from ...stores.s3.cluster_bucket import ClusterBucket

log = logging.getLogger(__name__)

STAGE_TIMEOUT = 30.0
"""Seconds a staging request (a part, a PUT, a completion, a delete) may take besides its
transfer, unless `--cluster-timeout` is longer."""
SETTLE_BATCH = 100
"""Records deleted in one etcd transaction (etcd refuses more than 128 operations in one, by
default)."""


class StagingFailed(Exception):
    """The cluster store or etcd did not take a file; it stays node-durable."""


class QueueNotHeld(Exception):
    """This node does not hold its own queue (its owner key) now."""


def cluster_id(cluster_cache: str) -> str:
    """The cluster's name in etcd: its cluster store's bucket and prefix, as one path element."""
    return quote(cluster_cache.removeprefix("s3://").strip("/"), safe="")


@dataclass(frozen=True)
class Record:
    """One committed file of a node's queue."""

    id: str
    source_url: str
    key: str
    size: int
    mtime: float
    attrs: tuple[int | float | None, ...] | None
    """`Attrs.fields()`."""
    kind: str = DATA
    """What the origin must get: the staged object (`data`; none for size 0), a deletion
    (`deleted`) or a copy of `copy_from`'s version `copy_etag` (`copy`)."""
    copy_from: str | None = None
    copy_etag: str | None = None

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> Record:
        fields = json.loads(text)
        if fields["attrs"] is not None:
            fields["attrs"] = tuple(fields["attrs"])
        return cls(**fields)

    @property
    def attributes(self) -> Attrs | None:
        return None if self.attrs is None else Attrs(*self.attrs)

    @property
    def token(self) -> str:
        return token_of(self.id)


def token_of(record_id: str) -> str:
    """What names a record's staging object (`ClusterQueue.object_name`); records may share
    one (a renamed file's record names the object staged for its old key)."""
    return record_id.rsplit("-", 1)[-1]


class ClusterQueue:
    """The staging objects and records of one cluster (`cluster_id`), for node `node`; the
    records and objects of other nodes are read and settled by a take-over."""

    def __init__(self, bucket: ClusterBucket, etcd: Etcd, cluster: str, node: str) -> None:
        self.bucket = bucket.with_timeout(max(bucket.timeout, STAGE_TIMEOUT))
        self.etcd = etcd
        self.cluster = cluster
        self.node = node
        self.root = f"/avafs/{cluster}/"
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self.failing_since: float | None = None
        self._drops = ThreadPoolExecutor(1, thread_name_prefix="avafs-unstage")
        self._to_settle: list[tuple[str, bool]] = []
        """(record id, whether its object goes too) of this node's dropped records, oldest
        first, until the drop thread takes them (`_settle_dropped`)."""
        self.fence: Callable[[], tuple[str, str] | None] = lambda: None
        """This node's owner key and the value it holds while this node holds its queue
        (takeover.py), or None while it does not: staging waits for it."""

    # --- names ---------------------------------------------------------------------------------

    def queue_prefix(self, node: str | None = None) -> str:
        return f"{self.root}queue/{node or self.node}/"

    def object_name(self, node: str, record_id: str) -> str:
        return f"staging/{node}/{token_of(record_id)}"

    def new_staging_object(self) -> str:
        """A fresh name for a staging object of this node, for `stage(streamed=...)`."""
        return f"staging/{self.node}/{uuid.uuid4().hex}"

    # --- staging -------------------------------------------------------------------------------

    def available(self) -> bool:
        """False from a failure until a stage succeeds: commits leave staging to the
        re-stager meanwhile."""
        with self._lock:
            failing = self.failing_since is not None
        return not failing and self.fence() is not None

    def probe(self) -> bool:
        """Stage nothing the way a commit stages a file (an object of this node's put, then
        deleted; an etcd transaction fenced by its owner key), for the re-stager to end a
        failure that left nothing to stage again; True if both answered."""
        name = self.new_staging_object()
        try:
            self.bucket.put(name, io.BytesIO(), 0)
            self.bucket.delete(name)
        except Exception as error:  # noqa: BLE001 - the store does not take writes yet
            self._failed(error)
            return False
        try:
            self.stage_all([])
        except StagingFailed:
            return False
        return True

    def new_record(self, source_url: str, key: str, size: int, mtime: float,
                   attrs: Attrs | None, kind: str = DATA, copy_from: str | None = None,
                   copy_etag: str | None = None, staged_object: str | None = None,
                   made: int | None = None) -> Record:
        """A record of a state as it was at `made` (`time.time_ns()`, now if None), which
        orders it among the key's records; its staging object is `staged_object` (a name from
        `new_staging_object`, or the object of an earlier record that still holds the data),
        or a fresh one."""
        token = (staged_object or self.new_staging_object()).rsplit("/", 1)[-1]
        made = time.time_ns() if made is None else made
        return Record(f"{made:020d}-{token}", source_url, key, size, mtime,
                      None if attrs is None else tuple(attrs.fields()), kind,
                      copy_from, copy_etag)

    def stage(self, record: Record, path: Path | None = None) -> None:
        """Put the file at `path` (its first `record.size` bytes) as the record's staging
        object, then the record in the cluster; without `path` the object is there already
        (streamed, or staged for an earlier record) or the record needs none. Raises
        StagingFailed (and pauses staging) when the store or etcd does not take it."""
        self.stage_all([record], {record.id: path} if path is not None else {})

    def stage_all(self, records: list[Record], paths: dict[str, Path] | None = None) -> None:
        """`stage` for several records (`paths`: the data file of each record id that needs
        its object put), whose records go in one etcd transaction (all or none): the states
        of one namespace change."""
        paths = paths or {}
        names = [self.object_name(self.node, record.id) for record in records
                 if record.id in paths]
        try:
            for record in records:
                if record.id in paths:
                    with open(paths[record.id], "rb") as file:
                        self.bucket.put(self.object_name(self.node, record.id),
                                        _Exactly(file, record.size), record.size)
            try:
                fence = self.fence()
                if fence is None or not self.etcd.put_if(
                        [(self.queue_prefix() + record.id, record.encode()) for record in records],
                        *fence):
                    raise QueueNotHeld("this node does not hold its queue in etcd (its lease "
                                       "expired); it stages again once it does")
            except (EtcdUnavailable, QueueNotHeld):
                for name in names:
                    self._drops.submit(self._delete_object, name)
                raise
        except Exception as error:  # noqa: BLE001 - any failure leaves the state node-durable
            self._failed(error)
            raise StagingFailed(str(error)) from None
        with self._lock:
            if self.failing_since is not None:
                log.warning("cluster writes: the cluster takes writes again; staging resumes")
            self.failing_since, self.last_error = None, None

    def _failed(self, error: Exception) -> None:
        with self._lock:
            first = self.failing_since is None
            if first:
                self.failing_since = time.monotonic()
            self.last_error = str(error)
        if first:
            log.warning("cluster writes: cannot stage in the cluster (%s); writes are only "
                        "node-durable until it answers, then staged again", error)

    def drop(self, record_id: str, keep_object: bool = False) -> None:
        """Forget one of this node's records and its object (not the object where a newer
        record names it too: `keep_object`), in the background (called with `WriteBack.lock`
        held: it only queues)."""
        with self._lock:
            self._to_settle.append((record_id, not keep_object))
            idle = len(self._to_settle) == 1
        if idle:  # else a drain is queued or running, and takes this one too
            self._drops.submit(self._settle_dropped)

    def _settle_dropped(self) -> None:
        while True:
            with self._lock:
                batch = self._to_settle[:SETTLE_BATCH]
                del self._to_settle[:SETTLE_BATCH]
            if not batch:
                return
            self._settle_batch(batch)

    def _settle_batch(self, batch: list[tuple[str, bool]]) -> None:
        """`settle` for several of this node's records: the records in one transaction, then
        the objects that go with them."""
        try:
            self.etcd.delete_all([self.queue_prefix() + record_id for record_id, _ in batch])
        except EtcdUnavailable as error:
            log.warning("cluster writes: could not delete %d settled records (%s); a take-over "
                        "of this node would upload them again", len(batch), error)
            return
        names = [self.object_name(self.node, record_id) for record_id, delete in batch if delete]
        try:
            refused = self.bucket.delete_all(names)
        except Exception as error:  # noqa: BLE001 - garbage a take-over sweeps
            log.info("cluster writes: could not delete %d staging objects: %s", len(names), error)
            return
        if refused:
            log.info("cluster writes: the cluster store kept %d of %d staging objects it was "
                     "asked to delete", refused, len(names))

    def _delete_object(self, name: str) -> None:
        try:
            self.bucket.delete(name)
        except Exception as error:  # noqa: BLE001 - garbage a take-over sweeps
            log.info("cluster writes: could not delete %s: %s", name, error)

    # --- reading and settling a queue ----------------------------------------------------------

    def records(self, node: str) -> list[Record]:
        """The records of `node`'s queue, oldest commit first. Raises EtcdUnavailable."""
        return [Record.decode(value) for _, value in self.etcd.get_prefix(self.queue_prefix(node))]

    def queued_nodes(self) -> set[str]:
        """Nodes that have records. Raises EtcdUnavailable."""
        prefix = f"{self.root}queue/"
        return {key[len(prefix):].split("/", 1)[0]
                for key, _ in self.etcd.get_prefix(prefix)}

    def open_staged(self, node: str, record: Record) -> BinaryIO:
        """The staging object of `record`, streamed. Raises StoreError."""
        return self.bucket.open_object(self.object_name(node, record.id), record.size)

    def stage_in_place_of(self, node: str, copy: Record, body: BinaryIO, mtime: float,
                          attrs: Attrs) -> Record | None:
        """A record of `node`'s queue holding the data `copy` copies (`body`: its `copy.size`
        bytes, read from the origin) with `mtime` and `attrs`, in the copy's place: the same
        commit time, so the same order among the key's records, and the copy's record deleted
        in the transaction that puts it. None, with nothing left behind, if the copy's record
        is gone (settled, or put in place of by another drainer). Raises StoreError,
        EtcdUnavailable."""
        made = int(copy.id.rsplit("-", 1)[0])
        record = self.new_record(copy.source_url, copy.key, copy.size, mtime, attrs,
                                 staged_object=f"staging/{node}/{uuid.uuid4().hex}", made=made)
        name = self.object_name(node, record.id)
        if record.size:
            self.bucket.put(name, _Exactly(body, record.size), record.size)
        if self.etcd.replace(self.queue_prefix(node) + copy.id,
                             [(self.queue_prefix(node) + record.id, record.encode())]):
            return record
        self._delete_object(name)
        return None

    def settle(self, node: str, record_id: str, delete_object: bool = True) -> None:
        """The record first, then its object unless another record names it (a record never
        names a missing object)."""
        self.etcd.delete(self.queue_prefix(node) + record_id)
        if delete_object:
            self.bucket.delete(self.object_name(node, record_id))

    def streaming_nodes(self) -> set[str]:
        """Nodes with staging uploads open (a node lost while it streamed a file may have no
        record to take over, only these). Raises StoreError."""
        return {key.split("/", 2)[1] for key, _ in self.bucket.open_uploads("staging/")}

    def sweep(self, node: str) -> int:
        """Delete `node`'s staging objects that no record names (a crash between a record's
        and its object's deletion, or a stage whose record failed) and abort its staging
        uploads (files it was streaming when it was lost); how many. Only for a node whose
        queue the caller holds and that is not running: a live node's streams are its own."""
        named = {self.object_name(node, record.id) for record in self.records(node)}
        unnamed = [key for key in self.bucket.keys_under(f"staging/{node}/") if key not in named]
        swept = len(unnamed) - self.bucket.delete_all(unnamed)
        for key, upload_id in self.bucket.open_uploads(f"staging/{node}/"):
            self.bucket.abort_upload(key, upload_id)
            swept += 1
        return swept

    def close(self) -> None:
        self._drops.shutdown(wait=True)


class _Exactly(FileView):
    """The first `size` bytes of `file`: the length the stage recorded, though a writer may be
    appending meanwhile (the record and the object must agree)."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        super().__init__(file)
        self._size = size

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._size - self._file.tell())
        return self._file.read(left if size is None or size < 0 else min(size, left))
