"""The daemon's counters, kept in prometheus-client objects as the single source of truth.

`avafs status` and the `/metrics` endpoint read the same objects, so the two can never
disagree. Each daemon has its own registry (tests run several daemons' code in one process).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TIERS = ("ram", "disk")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.hits = Counter("avafs_cache_hits", "Block reads served by a tier", ["tier"], registry=r)
        self.misses = Counter("avafs_cache_misses", "Block reads that went to the store", registry=r)
        self.bytes_served = Counter("avafs_bytes_served", "Bytes of blocks served, by where they "
                                    "came from", ["source"], registry=r)
        self.evictions = Counter("avafs_evictions", "Blocks evicted", ["tier"], registry=r)
        self.store_requests = Counter("avafs_store_requests", "Requests sent to object stores",
                                      ["operation"], registry=r)
        self.store_errors = Counter("avafs_store_errors", "Store requests that failed after "
                                    "retries", ["operation"], registry=r)
        self.store_latency = Histogram(
            "avafs_store_request_seconds", "Store request latency", ["operation"], registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.tier_used = Gauge("avafs_tier_used_bytes", "Bytes held by a tier", ["tier"], registry=r)
        self.tier_files = Gauge("avafs_tier_files", "Blocks held by a tier", ["tier"], registry=r)
        self.tier_capacity = Gauge("avafs_tier_capacity_bytes", "Configured tier size", ["tier"],
                                   registry=r)
        self.warmup_files = Counter("avafs_warmup_files", "Files loaded by warmups", registry=r)
        self.warmup_bytes = Counter("avafs_warmup_bytes", "Bytes loaded by warmups", registry=r)
        self.warmups_running = Gauge("avafs_warmups_running", "Warmups in progress", registry=r)
        self.prefetch_pending = Gauge("avafs_prefetch_pending", "Prefetch hints waiting",
                                      registry=r)
        self.dirty_bytes = Gauge("avafs_dirty_bytes", "Written bytes not yet in the store",
                                 registry=r)
        self.upload_queue = Gauge("avafs_upload_queue_length", "Files waiting for upload",
                                  registry=r)
        self.upload_failures = Counter("avafs_upload_failures", "Upload attempts that failed "
                                       "(each is retried)", registry=r)
        self.uploads_set_aside = Gauge("avafs_uploads_set_aside", "Pending changes the store "
                                       "refused for good, kept locally until 'avafs flush' or "
                                       "the next mount tries them again", registry=r)
        self.store_unreachable = Gauge("avafs_store_unreachable", "1 while a store fails "
                                       "every request in a way that may pass", ["store"],
                                       registry=r)
        # Children looked up once: labels() costs microseconds, and reads count every block.
        self.tier_hits = {tier: self.hits.labels(tier) for tier in TIERS}
        self.served_from = {source: self.bytes_served.labels(source)
                            for source in ("ram", "disk", "store")}
        for tier in TIERS:
            self.evictions.labels(tier)

    def value(self, metric: Counter | Gauge, *labels: str) -> float:
        """Current value of a counter or gauge (children by label values)."""
        child = metric.labels(*labels) if labels else metric
        return child._value.get()
