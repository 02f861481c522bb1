"""Cluster membership and take-over of a lost node's queue (`--writeback cluster`).

Mechanism. Each daemon holds an etcd lease of `--cluster-lease-ttl` seconds, kept alive by its
`avafs-lease` thread, and two keys bound to it: `/avafs/<cluster>/nodes/<node>` (alive) and
`/avafs/<cluster>/owner/<node>` (who uploads that node's queue). When a daemon dies its lease
expires and etcd deletes both. The `avafs-cluster-watch` thread of every other daemon looks for
nodes that have records but no owner and tries to create their owner key bound to its own lease,
in one etcd transaction that succeeds only where the key is absent: exactly one daemon wins and
drains that queue (`drain`), uploading each key's last record from its staging object to the
origin in record order (a copy ahead of what changes the key it reads; the copies of a cycle
that cannot be are first staged as the data they copy), settling each record as its upload lands,
then deleting the owner key.
A taker that dies part way loses the owner key with its lease, and another daemon takes over
where it stopped (an upload done twice is idempotent: the same bytes).

Invariants.
- Never two uploaders of one queue: only the owner key's holder uploads a queue's records.
- Fencing: a daemon holds its own queue only while its owner key names its lease and a lease
  TTL has not passed since the last keep-alive etcd answered was sent (etcd never expires a
  lease sooner). Only then does it stage, and the transaction that writes a record also
  compares the owner key with the value this daemon gave it, so no record is added to a queue
  someone else owns (cluster/queue.py). Its own uploaders start uploads only then too
  (`WriteBack.may_upload`), so while a taker uploads the node's records no newer upload of
  the same key starts here; an upload already under way when the lease lapsed may still land
  before a taker's older record of that key (keep the TTL above the longest upload, or etcd
  outages short).
- A daemon whose keep-alive finds its lease expired (etcd unreachable, or the process stalled,
  for longer than the TTL) reports node-durable, takes a new lease, waits until no taker holds
  its owner key (the taker deletes it once the queue is drained), takes the key again, and
  its watch thread stages again what it acknowledged meanwhile. A daemon starting under a
  name whose owner key is held (its previous life's lease not yet expired, or a taker
  draining it) waits for it the same way before it joins.
- A lost node may leave a staging upload open (a file it was streaming, not acknowledged):
  nodes with staging uploads open are taken over like nodes with records, and a drained
  queue is swept (`ClusterQueue.sweep`: objects no record names, uploads open), by a daemon
  and by `avafs recover` alike.
- Records of this node's previous life that no journaled state names (the node's disk was
  replaced) are drained by the node itself when it takes its key, except keys it has a
  newer state of.

Threads and locks. `_lock` guards the take-over table and the membership state and is a leaf.
The watch thread calls `WriteBack.restage`, which takes `WriteBack.lock` itself; nothing here
is called with `WriteBack.lock` held.
"""

from __future__ import annotations

import io
import logging
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import AvafsError, ObjectChangedError, StoreError
from ...metrics import Metrics
from ...stores.base import ObjectStore
from ...stores.metadata import Attrs
from ..manager import WriteBack
from ..pending import COPY, DATA, DELETED
from .coordination import EtcdUnavailable
from .queue import ClusterQueue, Record

log = logging.getLogger(__name__)

OpenOrigin = Callable[[str], ObjectStore]
"""The origin store of a source URL, as the records name it."""
_RETRY_FIRST, _RETRY_LAST = 0.5, 10.0


class QueueLost(Exception):
    """This daemon no longer holds the owner key of the queue it was draining."""


TAKEOVERS_KEPT = 50
"""Take-over events the status lists (the newest; the metrics count every one)."""


@dataclass
class Takeover:
    """One drain of a queue by this daemon: an event of the status, running until `finished`.
    A node taken over twice (it came back, then was lost again) has two."""

    node: str
    started: float = field(default_factory=time.time)
    finished: float | None = None
    files: int = 0
    """Records applied to the origin (uploads, deletions, copies)."""
    bytes: int = 0
    """Bytes uploaded from staging objects."""
    settled: int = 0
    outcome: str = "running"
    """running, drained, or stopped (this daemon lost its lease; another takes over)."""
    error: str | None = None
    """The last failure, retried (cleared by the next pass that succeeds)."""

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "started": self.started, "finished": self.finished,
                "files": self.files, "bytes": self.bytes, "settled": self.settled,
                "outcome": self.outcome, "error": self.error}


def drain(queue: ClusterQueue, node: str, open_origin: OpenOrigin, still_owner: Callable[[], bool],
          progress: Takeover, only: set[str] | None = None,
          keep_keys: set[tuple[str, str]] = frozenset(), spill_dir: Path | None = None) -> None:
    """Apply `node`'s records (those in `only`, if given) to the origin in record order, each
    copy ahead of what changes the key it reads (`_copies_first`), the last record of each key
    only (an upload, a deletion or a copy), settling each as it lands, until none is left;
    retried with backoff while `still_owner()` holds. Keys in `keep_keys` have a newer state
    on this node: their records are settled without an upload. A staging object goes with the
    last record that names it. The copies of a cycle, which no order can put ahead of their
    source's replacement, are first staged as the data they copy (`_stage_late_copies`, their
    sources read through temporary files in `spill_dir`, the system's temporary directory if
    None), so nothing is applied while the queue holds a copy whose source it replaces, and a
    taker that dies part way leaves the next one nothing it cannot apply. A copy whose source
    another writer changed in the origin is dropped with the deletion of that source, which
    would delete that writer's version. Raises QueueLost."""
    only = None if only is None else set(only)
    delay = _RETRY_FIRST
    while True:
        if not still_owner():
            raise QueueLost(node)
        try:
            every = queue.records(node)
            records = [record for record in every if only is None or record.id in only]
            if not records:
                break
            naming = Counter(record.token for record in every)
            last = {(record.source_url, record.key): record.id for record in records}
            applied = [record for record in records
                       if last[(record.source_url, record.key)] == record.id and
                       (record.source_url, record.key) not in keep_keys]
            applied_ids = {record.id for record in applied}
            settled_only = [record for record in records if record.id not in applied_ids]
            ordered = _copies_first(applied)
            if _stage_late_copies(queue, node, _copies_of_replaced_keys(ordered), open_origin,
                                  spill_dir, only):
                continue  # the queue changed: order it again
            dropped: set[str] = set()
            for record in settled_only + ordered:
                if not still_owner():
                    raise QueueLost(node)
                if record.id in dropped:
                    continue
                if record.id in applied_ids:
                    if not _apply(queue, node, record, open_origin):
                        # Its source's deletion goes first, so a pass that stops in between
                        # tries the copy again rather than deleting the other writer's version.
                        for deletion in _deletions_of(ordered, record):
                            _settle(queue, node, deletion, naming, progress)
                            dropped.add(deletion.id)
                    progress.files += 1
                    progress.bytes += record.size if record.kind == DATA else 0
                _settle(queue, node, record, naming, progress)
            delay = _RETRY_FIRST
            progress.error = None
        except QueueLost:
            raise
        except Exception as error:  # noqa: BLE001 - retried for as long as this daemon owns it
            progress.error = str(error)
            log.warning("take-over of node %s: %s; retrying in %.1fs", node, error, delay)
            time.sleep(delay)
            delay = min(delay * 2, _RETRY_LAST)
    if only is None:
        try:
            queue.sweep(node)
        except Exception as error:  # noqa: BLE001 - garbage only: the next take-over sweeps
            log.info("take-over of node %s: staging objects not swept: %s", node, error)


def _copies_first(records: list[Record]) -> list[Record]:
    """`records` (one per key, oldest commit first) with every copy ahead of the record of the
    key it reads, which deletes or replaces that key's version in the origin: the order a
    node's own uploader keeps (a rename's deletion waits for its copy, a new state of a key
    for the copies reading it). Record order alone does not: a copy staged again later (its
    attributes changed, or staged twice at once) has a newer id than its source's deletion.
    Copies that read each other's keys in a cycle (files swapped by renames, which the lost
    node had not ended yet: upload_order.py) come out once each, and the last of them comes
    after the record that replaces its source (`_copies_of_replaced_keys`)."""
    readers: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        if record.kind == COPY and record.copy_from != record.key:
            readers.setdefault((record.source_url, record.copy_from), []).append(record)
    ordered: list[Record] = []
    placed: set[str] = set()
    for first in records:
        stack = [(first, False)]
        while stack:
            record, ready = stack.pop()
            if ready:
                ordered.append(record)
                continue
            if record.id in placed:
                continue
            placed.add(record.id)
            stack.append((record, True))
            stack.extend((reader, False) for reader in
                         reversed(readers.get((record.source_url, record.key), [])))
    return ordered


def _copies_of_replaced_keys(ordered: list[Record]) -> list[Record]:
    """The copies of `ordered` that come after a record of the key they read, which replaces
    or deletes the version they copy: the copies of a cycle that `_copies_first` could not
    put ahead (`mv a t; mv b a; mv t b` of files the origin has, before the node uploaded
    it). Their sources must be read before anything is applied."""
    written: set[tuple[str, str]] = set()
    late: list[Record] = []
    for record in ordered:
        if record.kind == COPY and record.copy_from != record.key and \
                (record.source_url, record.copy_from) in written:
            late.append(record)
        written.add((record.source_url, record.key))
    return late


def _stage_late_copies(queue: ClusterQueue, node: str, copies: list[Record],
                       open_origin: OpenOrigin, spill_dir: Path | None,
                       only: set[str] | None) -> bool:
    """Each copy of `copies` staged in its place in `node`'s queue as the data it copies
    (`ClusterQueue.stage_in_place_of`), read from the origin now, with the copy's attributes,
    else the source's; `only`, where given, follows the records put in place. Whether the
    queue changed (a copy put in place, or its record found gone). A source the origin no
    longer holds at that version is left as a copy: it fails as it would have, and is
    logged."""
    changed = False
    for record in copies:
        assert record.copy_from is not None and record.copy_etag is not None
        origin = open_origin(record.source_url)
        try:
            mtime, attrs = record.mtime, record.attributes
            if attrs is None:
                mtime, attrs = origin.copied_attributes(record.copy_from, record.copy_etag)
            with tempfile.TemporaryFile(dir=spill_dir) as body:
                source = origin.open_range(record.copy_from, 0, record.size, record.copy_etag)
                try:
                    _copy_exactly(source, body, record.size, record.copy_from)
                finally:
                    source.close()
                body.seek(0)
                put = queue.stage_in_place_of(node, record, body, mtime, attrs)
        except ObjectChangedError as error:
            log.error("take-over of node %s: cannot stage %r for its copy to %r: %s",
                      node, record.copy_from, record.key, error)
            continue
        changed = True
        if put is not None and only is not None:
            only.add(put.id)
    return changed


_SPILL_CHUNK = 8 << 20
"""Bytes read from a late copy's source at a time."""


def _copy_exactly(source: BinaryIO, body: BinaryIO, size: int, key: str) -> None:
    """`size` bytes from `source` into `body`; StoreError (the drain's pass is retried) for
    an answer that ends short."""
    left = size
    while left:
        chunk = source.read(min(left, _SPILL_CHUNK))
        if not chunk:
            raise StoreError(f"the origin's answer for {key!r} ended {left} bytes short")
        body.write(chunk)
        left -= len(chunk)


def _settle(queue: ClusterQueue, node: str, record: Record, naming: Counter[str],
            progress: Takeover) -> None:
    """`record` is done with: its staging object goes with the last record naming it."""
    naming[record.token] -= 1
    queue.settle(node, record.id, delete_object=naming[record.token] == 0)
    progress.settled += 1


def _deletions_of(ordered: list[Record], copy: Record) -> list[Record]:
    """The records of `ordered` that delete the key `copy` reads: a rename's deletion of its
    source, which must not land once the copy failed because another writer changed that
    key (it would delete what that writer put there)."""
    return [record for record in ordered
            if record.kind == DELETED and record.source_url == copy.source_url and
            record.key == copy.copy_from]


def _apply(queue: ClusterQueue, node: str, record: Record, open_origin: OpenOrigin) -> bool:
    """Bring the origin to what `record` says its key must become, as the uploader would.
    False for a copy whose source another writer changed or deleted: it is logged and
    dropped, and its source keeps that writer's version."""
    origin = open_origin(record.source_url)
    if record.kind == DELETED:
        origin.delete(record.key)
        return True
    if record.kind == COPY:
        try:
            origin.copy(record.copy_from, record.key, record.copy_etag,
                        None if record.attrs is None else record.mtime, record.attributes)
        except ObjectChangedError as error:
            log.error("take-over of node %s: cannot finish copying %r to %r: %s; another "
                      "writer changed or deleted the source, which is left as it is", node,
                      record.copy_from, record.key, error)
            return False
        return True
    body = queue.open_staged(node, record) if record.size else io.BytesIO(b"")
    try:
        origin.put(record.key, body, record.size, record.mtime, record.attributes or Attrs())
    finally:
        body.close()
    return True


class ClusterMember:
    """This daemon in its cluster: lease, own queue, re-staging, take-overs of lost nodes."""

    def __init__(self, queue: ClusterQueue, ttl: int, writeback: WriteBack,
                 open_origin: OpenOrigin, metrics: Metrics) -> None:
        self.queue = queue
        self.etcd = queue.etcd
        self.ttl = ttl
        self.writeback = writeback
        self.open_origin = open_origin
        self.metrics = metrics
        self.owner_key = f"{queue.root}owner/{queue.node}"
        self._lock = threading.Lock()
        self._lease: int | None = None
        """Written by the keep-alive thread (and `start` before it runs) only."""
        self._owner_value: str | None = None
        """What this node's owner key holds while this node holds it, else None."""
        self._held_until = 0.0
        """Monotonic time until which the owner key is provably this node's: a lease TTL after
        the last keep-alive (or grant) that etcd answered was sent."""
        self.takeovers: deque[Takeover] = deque(maxlen=TAKEOVERS_KEPT)
        """Take-over events, oldest first (guarded by `_lock`)."""
        self._stopping = threading.Event()
        metrics.cluster_unstaged.set_function(lambda: len(writeback.unstaged()))
        metrics.cluster_node_only.set_function(lambda: int(not self.cluster_durable()))
        queue.fence = self._fence
        writeback.may_upload = self.holds_queue
        self._threads = [threading.Thread(target=self._keep_alive, daemon=True, name="avafs-lease"),
                         threading.Thread(target=self._watch, daemon=True,
                                          name="avafs-cluster-watch")]

    @property
    def key_root(self) -> str:
        return self.queue.root

    def holds_queue(self) -> bool:
        """Whether this node provably holds its own queue now (so it may stage and upload)."""
        return self._fence() is not None

    def _fence(self) -> tuple[str, str] | None:
        with self._lock:
            if self._owner_value is None or time.monotonic() >= self._held_until:
                return None
            return self.owner_key, self._owner_value

    def start(self, join_timeout: float) -> None:
        """Join (waiting up to `join_timeout` seconds for this node's name to be free), drain
        what the node's previous life left that no journaled state names, and start the
        threads. etcd not answering is no failure: the threads join once it does."""
        deadline = time.monotonic() + join_timeout
        try:
            while not self._renew():
                if time.monotonic() > deadline:
                    raise AvafsError(
                        f"node name {self.queue.node!r} is in use in cluster "
                        f"{self.queue.cluster} (a live daemon, or a take-over of its queue, "
                        "holds it): give this node its own --node-name, or wait and mount again")
                time.sleep(0.5)
        except EtcdUnavailable as error:
            log.warning("cluster writes: etcd does not answer (%s); writes are only "
                        "node-durable until it does", error)
        for thread in self._threads:
            thread.start()

    def _renew(self) -> bool:
        """One keep-alive: extend the lease (a new one if it expired) and hold this node's
        owner key under it, if it is free; whether this node holds its queue now. A node
        that finds its lease expired stops staging and uploading at once (a taker may be
        draining its queue) and takes its owner key again once the taker has finished; the
        watch thread then stages again what was acknowledged meanwhile. Raises
        EtcdUnavailable."""
        sent = time.monotonic()
        if self._lease is not None and self.etcd.refresh(self._lease):
            if self._owner_value is None:
                return self._acquire(sent)
            with self._lock:
                self._held_until = sent + self.ttl
            return True
        if self._lease is not None and self._owner_value is not None and \
                self.etcd.get(self.owner_key) == self._owner_value:
            return self.holds_queue()  # the lease holds (its key does): extend it next time
        if self._owner_value is not None:
            log.error("cluster writes: this node's lease expired; writes are only node-durable "
                      "and uploads wait until it holds its queue again (another node may be "
                      "taking it over meanwhile)")
        with self._lock:
            self._owner_value = None
        self._lease = self.etcd.grant(self.ttl)
        return self._acquire(sent)

    def _acquire(self, sent: float) -> bool:
        """Create this node's owner key under the lease if it is free (a taker, or this
        node's previous life, holds it otherwise: wait for it)."""
        node, value = self.queue.node, f"{self.queue.node} {self._lease}"
        if not self.etcd.create(self.owner_key, value, self._lease) and \
                self.etcd.get(self.owner_key) != value:
            log.debug("cluster writes: the queue of %s is held by %s; waiting", node,
                      self.etcd.get(self.owner_key))
            return False
        self.etcd.put(f"{self.key_root}nodes/{node}", str(time.time()), self._lease)
        leftover = {record.id for record in self.queue.records(node)} - \
            self.writeback.staged_ids()
        with self._lock:
            self._owner_value, self._held_until = value, sent + self.ttl
        log.info("cluster writes: node %s holds its queue in cluster %s", node, self.queue.cluster)
        if leftover:
            self._start_drain(node, only=leftover)
        return True

    def _keep_alive(self) -> None:
        while not self._stopping.wait(max(self.ttl / 3, 0.3)):
            try:
                self._renew()
            except EtcdUnavailable as error:
                log.debug("cluster writes: keep-alive failed: %s", error)

    def _watch(self) -> None:
        while not self._stopping.wait(max(self.ttl / 3, 0.3)):
            try:
                if self.holds_queue():
                    self.writeback.restage()
                    self._take_over_lost_nodes()
            except EtcdUnavailable as error:
                log.debug("cluster writes: watch: %s", error)
            except Exception:
                log.exception("cluster writes: watch failed")

    def _take_over_lost_nodes(self) -> None:
        """Nodes with records, or with staging uploads open, whose owner key is free (their
        lease expired) are taken over; one of them at a time per node, by one daemon."""
        try:
            streaming = self.queue.streaming_nodes()
        except StoreError as error:
            log.debug("cluster writes: staging uploads not listed: %s", error)
            streaming = set()
        for node in sorted((self.queue.queued_nodes() | streaming) - {self.queue.node}):
            with self._lock:
                running = any(progress.node == node and progress.finished is None
                              for progress in self.takeovers)
            if running or self._lease is None:
                continue
            if self.etcd.create(f"{self.key_root}owner/{node}",
                                f"{self.queue.node} {self._lease}", self._lease):
                log.warning("cluster writes: node %s is gone (its lease expired); this node "
                            "takes over its queue", node)
                self.metrics.cluster_takeovers.inc()
                self._start_drain(node)

    def _start_drain(self, node: str, only: set[str] | None = None) -> None:
        progress = Takeover(node)
        with self._lock:
            self.takeovers.append(progress)
        keep = {(self.writeback.source_urls.get(source, ""), key)
                for source, key in self.writeback.pending_keys()} if only is not None else set()
        threading.Thread(target=self._drain, args=(node, progress, only, keep), daemon=True,
                         name=f"avafs-takeover-{node}").start()

    def _drain(self, node: str, progress: Takeover, only: set[str] | None,
               keep: set[tuple[str, str]]) -> None:
        try:
            drain(self.queue, node, self.open_origin, lambda: self.holds_queue() and not
                  self._stopping.is_set(), progress, only, keep, self.writeback.data_dir)
            if node != self.queue.node:
                self.etcd.delete(f"{self.key_root}owner/{node}")
            progress.outcome = "drained"
            log.warning("cluster writes: queue of node %s drained: %d changes applied to the "
                        "origin (%d bytes uploaded)", node, progress.files, progress.bytes)
        except QueueLost:
            progress.outcome = "stopped"
            log.warning("cluster writes: stopped draining the queue of node %s: this node lost "
                        "its lease; another node takes it over", node)
        except EtcdUnavailable as error:
            progress.outcome = "stopped"
            log.warning("cluster writes: take-over of node %s: %s", node, error)
        finally:
            self.metrics.cluster_takeover_uploads.inc(progress.files)
            self.metrics.cluster_takeover_bytes.inc(progress.bytes)
            self.metrics.cluster_takeovers_ended.labels(progress.outcome).inc()
            progress.finished = time.time()

    def cluster_durable(self) -> bool:
        """Whether committed writes are durable in the cluster now."""
        return self.holds_queue() and self.queue.failing_since is None and \
            not self.writeback.unstaged()

    def status(self) -> dict[str, Any]:
        with self._lock:
            takeovers = [progress.as_dict() for progress in self.takeovers]
        return {"node": self.queue.node, "cluster": self.queue.cluster,
                "etcd": list(self.etcd.urls), "joined": self.holds_queue(),
                "durable_in": "cluster" if self.cluster_durable() else "node",
                "unstaged": len(self.writeback.unstaged()),
                "staged_bytes": self.writeback.staged_bytes,
                "staging_limit": self.writeback.staging_limit,
                "last_error": self.queue.last_error, "takeovers": takeovers}

    def stop(self) -> None:
        """Leave: the lease is revoked. What is still queued (an unmount without flush) is
        then taken over by another daemon like a lost node's queue, and uploaded again by this
        node's next mount from its journal (the same bytes)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._lease is not None:
            try:
                self.etcd.revoke(self._lease)
            except EtcdUnavailable as error:
                log.info("cluster writes: lease not revoked (%s); it expires on its own", error)


def recover(queue: ClusterQueue, node: str, ttl: int, open_origin: OpenOrigin,
            report: Callable[[Takeover], None]) -> Takeover:
    """`avafs recover --node NODE`: drain `node`'s queue from here, holding its owner key
    under a lease of our own, as a take-over by a daemon would. AvafsError if the node is
    alive or its queue is being drained by another daemon."""
    etcd = queue.etcd
    lease = etcd.grant(ttl)
    stopping = threading.Event()

    def keep_alive() -> None:
        while not stopping.wait(max(ttl / 3, 0.3)):
            try:
                etcd.refresh(lease)
            except EtcdUnavailable as error:
                log.warning("recover: keep-alive failed: %s", error)

    keeper = threading.Thread(target=keep_alive, daemon=True, name="avafs-lease")
    keeper.start()
    try:
        if etcd.get(f"{queue.root}nodes/{node}") is not None:
            raise AvafsError(f"node {node!r} is alive (its lease holds): its daemon uploads its "
                             "queue; recover only a node that is gone")
        if not etcd.create(f"{queue.root}owner/{node}", f"recover:{queue.node}", lease):
            holder = etcd.get(f"{queue.root}owner/{node}")
            raise AvafsError(f"the queue of node {node!r} is being uploaded by {holder}: wait "
                             "for it to finish")
        progress = Takeover(node)
        done = threading.Event()

        def show() -> None:
            while not done.wait(1.0):
                report(progress)

        shower = threading.Thread(target=show, daemon=True)
        shower.start()
        try:
            drain(queue, node, open_origin, lambda: True, progress)
        finally:
            done.set()
            shower.join()
        etcd.delete(f"{queue.root}owner/{node}")
        progress.finished, progress.outcome = time.time(), "drained"
        return progress
    finally:
        stopping.set()
        keeper.join()
        try:
            etcd.revoke(lease)
        except EtcdUnavailable as error:
            log.info("recover: lease not revoked (%s); it expires on its own", error)
