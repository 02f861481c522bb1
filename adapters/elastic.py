"""The trainer side of elastic sharding: leasing tasks, tagging samples, acknowledging them.

A DataLoader worker (or a tf.data generator) leases tasks and produces their samples, each tagged
with its lease. The training loop sees samples only when a step consumes them, so that is where
tasks are acknowledged (`AckTracker`, `acknowledged_epoch`): acknowledging when a worker merely
produced a task would lose the samples still queued in a trainer that then died.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from adapters.sharding import AckResult, CoordinatorClient, Lease

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseTag:
    """Rides along with every sample of a leased task so the consumer can acknowledge the task.

    Only the task's last sample carries `count`, the number of samples in the task: producers
    stream shards without counting them first, and the consumer learns the total when it arrives.
    """

    job: str
    epoch: int
    task: int
    token: str
    count: int | None = None

    def format(self) -> str:
        base = f"{self.job}/{self.epoch}/{self.task}/{self.token}"
        return base if self.count is None else f"{base}/{self.count}"

    @classmethod
    def parse(cls, text: str | bytes) -> LeaseTag:
        if isinstance(text, bytes):
            text = text.decode()
        parts = text.split("/")
        if len(parts) not in (4, 5):
            raise ValueError(f"not a lease tag: {text!r}")
        count = int(parts[4]) if len(parts) == 5 else None
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3], count)

    @classmethod
    def of(cls, lease: Lease) -> LeaseTag:
        return cls(lease.job, lease.epoch, lease.task, lease.token)

    @property
    def lease_key(self) -> tuple[str, int, int, str]:
        return self.job, self.epoch, self.task, self.token


def worker_identity() -> str:
    """Names a trainer in lease records, so an operator can tell whose leases expired."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def tagged_task_samples(client: CoordinatorClient, lease: Lease,
                        samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Tags a leased task's samples, renews the lease while producing, and acks empty tasks.

    The last sample's tag carries the task's sample count, so the consumer knows when it has seen
    them all. A task whose lease was lost mid-way stops: its new holder delivers the rest.
    """
    tag = LeaseTag.of(lease).format()
    renewed_at = time.monotonic()
    previous: dict[str, Any] | None = None
    count = 0
    for sample in samples:
        if previous is not None:
            yield previous
        if time.monotonic() - renewed_at > lease.ttl / 3:
            if not client.renew(lease):
                log.warning("lease on task %d of epoch %d was lost; its new holder reads it",
                            lease.task, lease.epoch)
                return
            renewed_at = time.monotonic()
        sample["__lease__"] = tag
        previous = sample
        count += 1
    if previous is None:
        client.ack(lease, samples=0)
        return
    previous["__lease__"] = LeaseTag(lease.job, lease.epoch, lease.task, lease.token,
                                     count).format()
    yield previous


def leased_tasks(client: CoordinatorClient, epoch: int, worker: str) -> Iterator[Lease]:
    """Leases tasks until none is leasable now; the consumer loop retries later for stragglers."""
    while (lease := client.lease(epoch, worker)) is not None:
        yield lease


class AckTracker:
    """Acknowledges a task once all its samples have been consumed by the training loop.

    A DataLoader worker has produced a sample long before the step that trains on it; acking at
    production would lose samples that sat in the prefetch queue of a trainer that then died.
    The tracker sees batches in the order the loop consumes them, counts samples per lease, and
    acks a task only after the step that consumed its last sample returned. It also renews the
    leases of tasks it is still consuming, every third of the lease TTL.
    """

    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client
        self.seen: Counter[tuple[str, int, int, str]] = Counter()
        self.expected: dict[tuple[str, int, int, str], LeaseTag] = {}
        self.outstanding: dict[tuple[str, int, int, str], LeaseTag] = {}
        self.results: Counter[AckResult] = Counter()
        self.acked_samples = 0
        self._ttl: float | None = None
        self._renewed_at = time.monotonic()

    def consumed(self, tags: Iterable[str | bytes]) -> None:
        """Records one consumed batch's lease tags and acks the tasks it completed."""
        completed = []
        for text in tags:
            tag = LeaseTag.parse(text)
            key = tag.lease_key
            self.seen[key] += 1
            self.outstanding.setdefault(key, tag)
            if tag.count is not None:
                self.expected[key] = tag
            final = self.expected.get(key)
            if final is not None and self.seen[key] == final.count:
                completed.append(final)
        for tag in completed:
            self._ack(tag)
        self._renew_if_due()

    def release_outstanding(self) -> None:
        """Hands back the tasks of a loop that stops early, so others need not wait for expiry."""
        for tag in list(self.outstanding.values()):
            self.client.release(tag)
        self.outstanding.clear()

    def _ack(self, tag: LeaseTag) -> None:
        assert tag.count is not None
        result = self.client.ack(tag, samples=tag.count)
        self.results[result] += 1
        if result is AckResult.ACCEPTED:
            self.acked_samples += tag.count
        for table in (self.seen, self.expected, self.outstanding):
            table.pop(tag.lease_key, None)

    def _renew_if_due(self) -> None:
        if not self.outstanding:
            return
        if self._ttl is None:
            self._ttl = self.client.lease_ttl()
        if time.monotonic() - self._renewed_at < self._ttl / 3:
            return
        self._renewed_at = time.monotonic()
        for key, tag in list(self.outstanding.items()):
            if not self.client.renew(tag):
                self.outstanding.pop(key)


def acknowledged_epoch(client: CoordinatorClient, epoch: int, passes: Callable[[], Iterable[Any]],
                       tags_of: Callable[[Any], Iterable[str | bytes]],
                       poll_interval: float = 0.5) -> Iterator[Any]:
    """Runs passes over a dynamic dataset until the coordinator reports the epoch complete.

    A pass ends when nothing is leasable right now. Tasks still leased by other trainers may yet
    expire (their trainer died), so instead of ending the epoch this waits and runs another pass
    to pick them up; the epoch ends only when every task is acknowledged.
    """
    tracker = AckTracker(client)
    try:
        while True:
            for batch in passes():
                yield batch
                tracker.consumed(tags_of(batch))
            status = client.status(epoch)
            while not status["done"] and status["leasable_tasks"] == 0:
                wait = status["next_expiry_in"]
                time.sleep(poll_interval if wait is None else min(max(wait, 0.05), poll_interval))
                status = client.status(epoch)
            if status["done"]:
                return
    finally:
        tracker.release_outstanding()
