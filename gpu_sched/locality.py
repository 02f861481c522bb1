"""Data locality: which nodes already cache the data a pod's avafs volumes read.

The node side (the avafs CSI plugin, which knows its volumes and their cache dirs) publishes the
bytes its caches hold per volume source URL as the node annotation `avafs.io/cached-bytes`
(`{"s3://datasets": 52613349376}`), at most once per interval and only when the figures moved.
The extender reads a pod's avafs volumes (inline CSI volumes, or a PersistentVolumeClaim bound
to an avafs PersistentVolume), and in /prioritize mixes how much of that data each candidate node
holds into the GPU policy's score. Nodes the GPU check rejected stay at 0, so locality only ever
orders nodes that fit.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml

log = logging.getLogger(__name__)

CACHED_BYTES_ANNOTATION = "avafs.io/cached-bytes"
AVAFS_DRIVER = "csi.avafs.io"
MAX_SCORE = 10


def cached_bytes(annotations: Mapping[str, Any]) -> dict[str, int]:
    """The node annotation read back; anything unreadable counts as nothing cached."""
    text = annotations.get(CACHED_BYTES_ANNOTATION)
    if not isinstance(text, str):
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(source): value for source, value in data.items()
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0}


def csi_sources(csi: Any) -> list[str]:
    """Source URLs of an avafs CSI volume source (`source`, or the URLs of `namespace`)."""
    if not isinstance(csi, dict) or csi.get("driver") != AVAFS_DRIVER:
        return []
    attributes = csi.get("volumeAttributes")
    if not isinstance(attributes, dict):
        return []
    if isinstance(attributes.get("source"), str):
        return [attributes["source"]]
    try:
        namespace = yaml.safe_load(attributes.get("namespace") or "")
    except yaml.YAMLError:
        return []
    return sorted(str(url) for url in namespace.values()) if isinstance(namespace, dict) else []


def pod_sources(pod: dict[str, Any], claim_sources: Callable[[str, str], list[str]]) -> list[str]:
    """Source URLs the pod's avafs volumes read; `claim_sources(namespace, claim)` resolves PVCs."""
    spec = pod.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, dict) else None
    if not isinstance(volumes, list):
        return []
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    sources: list[str] = []
    for volume in volumes:
        if not isinstance(volume, dict):
            continue
        sources += csi_sources(volume.get("csi"))
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, dict) and isinstance(claim.get("claimName"), str):
            sources += claim_sources(namespace, claim["claimName"])
    return sorted(set(sources))


def combine(gpu_scores: Mapping[str, int], held: Mapping[str, int], weight: float
            ) -> dict[str, int]:
    """GPU scores mixed with locality: (1 - weight) x GPU + weight x 10 x bytes / most bytes.

    Only nodes with a GPU score (nodes that fit) are mixed; when no fitting node holds any of
    the data the GPU scores stand as they are.
    """
    most = max((held.get(name, 0) for name in gpu_scores), default=0)
    if not most or not weight:
        return dict(gpu_scores)
    return {name: round((1 - weight) * score + weight * MAX_SCORE * held.get(name, 0) / most)
            for name, score in gpu_scores.items()}


class CachePublisher:
    """Publishes a node's cached bytes per source, at most once per `interval`, when they moved.

    `summary()` measures the caches; `annotate(annotations)` patches the node. Figures within
    `tolerance` (a share) of the published ones are not republished, so a steadily filling
    cache costs one patch per interval at most and an idle one none.
    """

    def __init__(self, summary: Callable[[], dict[str, int]],
                 annotate: Callable[[dict[str, str]], None], interval: float,
                 tolerance: float = 0.01, clock: Callable[[], float] = time.monotonic) -> None:
        self._summary = summary
        self._annotate = annotate
        self._interval = interval
        self._tolerance = tolerance
        self._clock = clock
        self._published: dict[str, int] | None = None
        self._last = float("-inf")

    def _moved(self, figures: dict[str, int]) -> bool:
        if self._published is None or figures.keys() != self._published.keys():
            return True
        return any(abs(figures[s] - self._published[s]) > self._tolerance
                   * max(self._published[s], 1) for s in figures)

    def maybe_publish(self) -> bool:
        """Publish if the interval has passed and the figures moved; True when it patched."""
        now = self._clock()
        if now - self._last < self._interval:
            return False
        figures = self._summary()
        if not self._moved(figures):
            return False
        self._annotate({CACHED_BYTES_ANNOTATION: json.dumps(figures, sort_keys=True,
                                                            separators=(",", ":"))})
        self._published, self._last = figures, now
        return True

    def run(self, stop: threading.Event, errors: Iterable[type[BaseException]]) -> None:
        """Publish until `stop` is set; the listed errors are logged and retried next interval."""
        caught = tuple(errors)
        while True:
            try:
                self.maybe_publish()
            except caught as exc:
                log.warning("publishing %s: %s", CACHED_BYTES_ANNOTATION, exc)
            if stop.wait(self._interval):
                return
