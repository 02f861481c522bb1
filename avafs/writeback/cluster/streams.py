"""Staging while writing (`--writeback cluster`): a file written front to back goes to its
staging object in the cluster store part by part as it grows, so its commit (close(),
fsync()) sends only the tail and completes the upload before it puts the record, instead of
sending the whole file.

It is StreamUploads (streaming.py) aimed elsewhere: the same parts, read from the same data
file as the writer goes past them, go to a second stream per file (`Pending.cluster_stream`)
whose key is a fresh staging object of this node (`ClusterQueue.new_staging_object`) in the
cluster bucket. A write or truncate below what was sent cancels both streams (the manager's
`_stop_streaming`); the commit then stages the whole file in one PUT, as it does when this
stream failed or the file changed while its tail went up.

A crash leaves no upload open for long: each stream's upload is journaled (under
CLUSTER_SOURCE) before its first part, and the next mount aborts those the journal lists as
started and not ended, as it does for the origin's streams. A stream completes only into a
staging object that its record is about to name; a crash between the two leaves an object no
record names, which a take-over's sweep deletes.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ...stores.base import MultipartUploads
from ...stores.metadata import Attrs
from ..journal import Journal
from ..pending import Pending, Stream
from ..streaming import StreamUploads
from .queue import ClusterQueue

log = logging.getLogger(__name__)

CLUSTER_SOURCE = "\x01cluster"
"""The journal's source of the uploads to the cluster store: no source's name starts with a
control character, so the origin's streams never take it for theirs."""


class ClusterStreams(StreamUploads):
    """The streams of one mount's written files to their staging objects in `queue`'s
    bucket; `lock` is the write-back's lock, as for StreamUploads."""

    def __init__(self, data_dir: Path, queue: ClusterQueue, lock: threading.RLock,
                 journal: Journal) -> None:
        super().__init__(data_dir, {CLUSTER_SOURCE: queue.bucket}, lock, journal)
        self._queue = queue

    def _target(self, entry: Pending) -> tuple[str, str, MultipartUploads] | None:
        """A fresh staging object, while staging is possible: a stream that cannot end in a
        stage would only cost the cluster store the bytes."""
        uploads = self._queue.bucket.multipart()
        if uploads is None or not self._queue.available():
            return None
        return CLUSTER_SOURCE, self._queue.new_staging_object(), uploads

    def _metadata(self, entry: Pending, committed: bool) -> tuple[float | None, Attrs | None]:
        """None: a staging object's attributes are in its record in the queue."""
        return None, None

    def _stream_of(self, entry: Pending) -> Stream | None:
        return entry.cluster_stream

    def _set_stream(self, entry: Pending, stream: Stream | None) -> None:
        entry.cluster_stream = stream

    def complete(self, entry: Pending, generation: int) -> str | None:
        """Send the tail of `entry`'s stream and complete its staging object (in the
        committing thread, holding no lock); the object's name, or None where the entry has
        no stream that completed with `generation`, so the stage PUTs the file whole."""
        with self._lock:
            stream = entry.cluster_stream
        if stream is None:
            return None
        try:
            completed = self.finish(entry, generation)
        except Exception as error:  # noqa: BLE001 - any failure: the stage PUTs it whole
            log.info("cluster writes: the staging upload of %s failed (%s); staging it whole",
                     entry.key, error)
            return None
        return None if completed is None else stream.key
