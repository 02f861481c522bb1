"""The daemon's counters, kept in prometheus-client objects as the single source of truth.

`avafs status` and the `/metrics` endpoint read the same objects, so the two can never
disagree. Each daemon has its own registry (tests run several daemons' code in one process).
The endpoint serves them through `exported`, which adds the labels that tell one mount from
another in a cluster's Prometheus: `mount` (the mountpoint, or the CSI volume id) and
`source_url` (the mount's sources, comma-separated), on every sample.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

TIERS = ("ram", "disk")
"""The node's own tiers; the cluster tier (`--cluster-cache`) is counted apart: it has no
size or evictions of its own (the store keeps those)."""
CLUSTER_ERRORS = ("get", "put", "claim", "corrupt")
STORE_OPERATIONS = ("get", "list", "head", "put", "delete", "copy")


class _WithMountLabels:
    """A collector that yields a registry's metrics with the mount's labels added."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [sample._replace(labels={**sample.labels, **self.labels})
                                for sample in family.samples]
            yield labelled


class Metrics:
    def __init__(self, mount: str = "", source_url: str = "") -> None:
        self.registry = CollectorRegistry()
        self.exported = CollectorRegistry(auto_describe=False)
        self.exported.register(_WithMountLabels(self.registry,
                                                {"mount": mount, "source_url": source_url}))
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
        self.read_ahead_files = Counter("avafs_read_ahead_files", "Small files fetched ahead "
                                        "of readers walking a directory in name order",
                                        registry=r)
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
        self.cluster_misses = Counter("avafs_cluster_misses", "Blocks the cluster tier did not "
                                      "hold, read from the source instead", registry=r)
        self.cluster_waits = Counter("avafs_cluster_waits", "Cluster tier hits on blocks "
                                     "waited for while another node filled them", registry=r)
        self.cluster_fills = Counter("avafs_cluster_fills", "Blocks written to the cluster tier",
                                     registry=r)
        self.cluster_fill_bytes = Counter("avafs_cluster_fill_bytes", "Bytes written to the "
                                          "cluster tier", registry=r)
        self.cluster_fills_dropped = Counter("avafs_cluster_fills_dropped", "Blocks not written "
                                             "to the cluster tier: its queue was full or the "
                                             "store down", registry=r)
        self.cluster_fill_queue = Gauge("avafs_cluster_fill_queue_bytes", "Bytes of blocks "
                                        "waiting to be written to the cluster tier", registry=r)
        self.cluster_errors = Counter("avafs_cluster_errors", "Cluster tier requests that "
                                      "failed, and damaged blocks found", ["kind"], registry=r)
        for kind in CLUSTER_ERRORS:
            self.cluster_errors.labels(kind)
        self.cluster_unstaged = Gauge("avafs_cluster_unstaged_files", "Committed files not "
                                      "staged in the cluster (--writeback cluster): only "
                                      "node-durable", registry=r)
        self.cluster_node_only = Gauge("avafs_cluster_writes_node_only", "1 while writes are "
                                       "only node-durable (the cluster store or etcd not "
                                       "answering, or files waiting to be staged)", registry=r)
        self.cluster_takeovers = Counter("avafs_cluster_takeovers", "Queues of lost nodes this "
                                         "daemon took over", registry=r)
        self.cluster_takeover_uploads = Counter("avafs_cluster_takeover_uploads", "Changes "
                                                "(files, deletions, copies) of lost nodes' "
                                                "queues this daemon applied to the origin",
                                                registry=r)
        self.cluster_takeover_bytes = Counter("avafs_cluster_takeover_bytes", "Bytes of lost "
                                              "nodes' queues this daemon uploaded to the origin",
                                              registry=r)
        self.cluster_takeovers_ended = Counter("avafs_cluster_takeovers_ended", "Take-overs "
                                               "that ended: drained, or stopped (this daemon "
                                               "lost its lease)", ["outcome"], registry=r)
        # Children looked up once: labels() costs microseconds, and reads count every block.
        self.tier_hits = {tier: self.hits.labels(tier) for tier in (*TIERS, "cluster")}
        self.served_from = {source: self.bytes_served.labels(source)
                            for source in ("ram", "disk", "cluster", "store")}
        for tier in TIERS:
            self.evictions.labels(tier)
        for operation in STORE_OPERATIONS:  # a zero, not no data, until the first failure
            self.store_errors.labels(operation)

    def value(self, metric: Counter | Gauge, *labels: str) -> float:
        """Current value of a counter or gauge (children by label values)."""
        child = metric.labels(*labels) if labels else metric
        return child._value.get()
