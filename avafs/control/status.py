"""The status document (`avafs status --json`, `Client.status()`), and the recent errors it
shows. Its fields are a public, documented interface (README, "Status JSON"): add fields,
never rename or remove them."""

from __future__ import annotations

import collections
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..log_format import printable
from ..metrics import CLUSTER_ERRORS, TIERS, Metrics

if TYPE_CHECKING:
    from ..config.options import MountOptions
    from ..snapshots.store import SnapshotStore
    from ..stores.base import ObjectStore
    from ..tiers.stack import TierStack
    from ..warmup.runner import Prefetcher, WarmupRunner

STATUS_VERSION = 1


class RecentErrors(logging.Handler):
    """Keeps the last warnings and errors for `avafs status`."""

    def __init__(self, size: int = 20) -> None:
        super().__init__(logging.WARNING)
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"time": record.created, "level": record.levelname.lower(),
                             "message": printable(record.getMessage())})


class StatusSource(Protocol):
    """What the status document is made of: the daemon's `Filesystem` is one, and this module
    needs nothing else of it, so it imports no daemon code."""

    options: MountOptions
    mountpoint: Path
    pid: int
    started_at: float
    metrics: Metrics
    stack: TierStack
    stores: dict[str, ObjectStore]
    snapshot: SnapshotStore | None
    warmups: WarmupRunner
    prefetcher: Prefetcher
    recent_errors: RecentErrors

    def dirty_status(self) -> dict[str, Any]: ...

    def cluster_writes_status(self) -> dict[str, Any] | None: ...


def _store_health(store: ObjectStore) -> dict[str, Any]:
    since = store.unreachable_since
    return {"url": store.url, "reachable": since is None,
            "unreachable_seconds": None if since is None else round(time.monotonic() - since, 3),
            "last_error": store.last_error}


def _cluster_status(filesystem: StatusSource) -> dict[str, Any] | None:
    """The cluster tier's counters; None for a mount without one."""
    cluster = filesystem.stack.cluster
    if cluster is None:
        return None
    metrics = filesystem.metrics
    return {
        "url": cluster.url,
        "reachable": cluster.reachable,
        "last_error": cluster.last_error,
        "hits": int(metrics.value(metrics.hits, "cluster")),
        "misses": int(metrics.value(metrics.cluster_misses)),
        "waits": int(metrics.value(metrics.cluster_waits)),
        "bytes_read": int(metrics.value(metrics.bytes_served, "cluster")),
        "fills": int(metrics.value(metrics.cluster_fills)),
        "bytes_written": int(metrics.value(metrics.cluster_fill_bytes)),
        "fills_dropped": int(metrics.value(metrics.cluster_fills_dropped)),
        "fill_queue_bytes": cluster.queued_bytes,
        "errors": {kind: int(metrics.value(metrics.cluster_errors, kind))
                   for kind in CLUSTER_ERRORS},
    }


def build_status(filesystem: StatusSource) -> dict[str, Any]:
    metrics = filesystem.metrics
    stack = filesystem.stack
    options = filesystem.options
    hits = {tier: int(metrics.value(metrics.hits, tier)) for tier in (*TIERS, "cluster")}
    misses = int(metrics.value(metrics.misses))
    lookups = sum(hits.values()) + misses
    tiers = {}
    for tier in (stack.ram, stack.disk):
        tiers[tier.name] = {
            "used_bytes": tier.used, "capacity_bytes": tier.capacity,
            "files": len(tier), "capacity_files": tier.capacity_files,
            "high_watermark": tier.high_watermark, "low_watermark": tier.low_watermark,
            "policy": tier.policy,
        }
    requests = {sample.labels["operation"]: int(sample.value)
                for sample in metrics.store_requests.collect()[0].samples
                if sample.name.endswith("_total")}
    return {
        "version": STATUS_VERSION,
        "mountpoint": str(filesystem.mountpoint),
        "pid": filesystem.pid,
        "uptime_seconds": round(time.time() - filesystem.started_at, 3),
        "sources": dict(options.sources),
        "snapshot": None if filesystem.snapshot is None
        else filesystem.snapshot.snapshot.summary.as_dict(),
        "cache_dir": str(options.cache_dir),
        "block_size": options.block_size,
        "tiers": tiers,
        "hits": hits,
        "misses": misses,
        "hit_ratio": round(sum(hits.values()) / lookups, 6) if lookups else None,
        "bytes_served": {source: int(metrics.value(metrics.bytes_served, source))
                         for source in ("ram", "disk", "cluster", "store")},
        "store_requests": requests,
        "evictions": {tier: int(metrics.value(metrics.evictions, tier)) for tier in TIERS},
        "dirty": filesystem.dirty_status(),
        "cluster": _cluster_status(filesystem),
        "cluster_writes": filesystem.cluster_writes_status(),
        "stores": {name: _store_health(store) for name, store in filesystem.stores.items()},
        "warmups": [job.as_dict() for job in filesystem.warmups.running()],
        "read_ahead_files": int(metrics.value(metrics.read_ahead_files)),
        "prefetch": {"queued": filesystem.prefetcher.queued,
                     "pending": filesystem.prefetcher.pending,
                     "done": filesystem.prefetcher.done,
                     "failed": filesystem.prefetcher.failed},
        "recent_errors": list(filesystem.recent_errors.records),
    }
