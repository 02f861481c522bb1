"""Under --writeback cluster: committed states staged in the cluster (queue.py) so any node
can finish them, records put for namespace changes once they are journaled, and states that
could not be staged staged again later; a part of WriteBack (writeback/manager.py). Staging
runs holding no lock; what it adopts into a state is adopted under `WriteBack.lock`."""

from __future__ import annotations

import logging
import time

from ..pending import DATA, Pending
from .queue import ClusterQueue, Record, StagingFailed, token_of
from .streams import ClusterStreams

log = logging.getLogger(__name__)


class ClusterStaging:
    def enable_cluster(self, queue: ClusterQueue, source_urls: dict[str, str],
                       staging_limit: int = 0) -> None:
        """Stage committed files in the cluster (`source_urls`: each source's URL, which
        the records name so any node can upload them); past `staging_limit` staged bytes
        (0: none) writers wait as past the dirty watermark."""
        self.cluster, self.source_urls = queue, source_urls
        self.staging_limit = staging_limit
        self.cluster_streams = ClusterStreams(self.data_dir, queue, self.lock, self.journal)

    def close_cluster(self) -> None:
        """Abort the staging uploads of files still open, then let the queue's work end."""
        if self.cluster_streams is not None:
            self.cluster_streams.stop()
        if self.cluster is not None:
            self.cluster.close()

    def _record_of(self, entry: Pending) -> Record | None:
        """The record of `entry` as it is now where it needs no data sent: a deletion, a copy,
        a directory marker, a file whose staged object still holds its data (renamed, or
        given new attributes); None for a file whose data must be sent (lock held)."""
        url = self.source_urls[entry.source]
        if entry.kind == DATA and entry.file:
            if entry.staged is None or not entry.staged_data_current:
                return None
            return self.cluster.new_record(
                url, entry.key, entry.size, entry.mtime, entry.attrs,
                staged_object=self.cluster.object_name(self.cluster.node, entry.staged))
        return self.cluster.new_record(url, entry.key, entry.size, entry.mtime, entry.attrs,
                                       entry.kind, entry.copy_from, entry.copy_etag)

    def _stage(self, entry: Pending) -> tuple[str, str, int] | None:
        """Stage the entry as it is now, holding no lock (its data file is held meanwhile);
        (record id, key, generation), or None if it stays node-durable."""
        with self.lock:
            if self._pending.get(entry.slot) is not entry or \
                    entry.staged_generation == entry.generation:
                return None  # gone, or staged as it is (an fsync, then the close)
            key, generation = entry.key, entry.generation
            record = self._record_of(entry)
            if record is None and not self.hold_file(entry.file):
                return None
            name, size, mtime, attrs = entry.file, entry.size, entry.mtime, entry.attrs
            # Timed under the lock: two commits of one file staging at once (two descriptors'
            # fsyncs) order their records as their generations, whichever is sent first.
            made = time.time_ns()
        if record is not None:
            try:
                self.cluster.stage(record)
            except StagingFailed:
                return None
            return record.id, key, generation
        try:
            streamed = None if self.cluster_streams is None else \
                self.cluster_streams.complete(entry, generation)
            record = self.cluster.new_record(self.source_urls[entry.source], key, size, mtime,
                                             attrs, staged_object=streamed, made=made)
            self.cluster.stage(record, None if streamed else self.data_dir / name)
        except StagingFailed:
            return None
        finally:
            self.drop_file(name)
        return record.id, key, generation

    def _stage_change(self, changes: list[Pending]) -> None:
        """Record the states of one namespace change (unlink, rename, mkdir, ...) in the
        cluster in one transaction, so a take-over replays all of it or none. Where one of
        them needs data sent (a renamed file whose staged object is stale) all wait for
        `restage`, which stages them one by one in order: the new key before the old key's
        deletion."""
        if self.cluster is None or not self.cluster.available():
            return
        with self.lock:
            states = []
            for entry in sorted(changes, key=lambda entry: entry.seq):
                if self._pending.get(entry.slot) is not entry:
                    continue
                record = self._record_of(entry)
                if record is None:
                    return
                states.append((entry, record, entry.key, entry.generation))
        if not states:
            return
        try:
            self.cluster.stage_all([record for _, record, _, _ in states])
        except StagingFailed:
            return
        self._journal_staged([(entry, record.id, key, generation)
                              for entry, record, key, generation in states])

    def _journal_staged(self, states: list[tuple[Pending, str, str, int]]) -> None:
        """Adopt staged records (entry, record id, key, generation) and journal the entries
        that keep them."""
        with self.lock:
            adopted = [entry for entry, *staged in states
                       if self._adopt_staged(entry, *staged) and entry.durable]
            if not adopted:
                return
            ticket = self.journal.submit(adopted)
        self.journal.wait(ticket)

    def _adopt_staged(self, entry: Pending, record: str, key: str, generation: int) -> bool:
        """Make `record` the entry's record unless the entry went, moved to another key, or
        has a newer one; the record left over is dropped, its object too unless the kept
        record names it (call with the lock held)."""
        newer = entry.staged_generation is not None and entry.staged_generation > generation
        current = entry.staged
        shared = current is not None and token_of(current) == token_of(record)
        if self._pending.get(entry.slot) is not entry or entry.key != key or newer:
            self.cluster.drop(record, keep_object=shared)
            return False
        if current is not None:
            self.cluster.drop(current, keep_object=shared)
        size = entry.size if entry.kind == DATA and entry.file else 0
        self.staged_bytes += size - entry.staged_bytes
        entry.staged, entry.staged_generation, entry.staged_bytes = record, generation, size
        entry.staged_data_current = generation == entry.generation
        return True

    def _unstage(self, entry: Pending) -> None:
        """The entry is no longer its key's state: its record goes (in the background)."""
        if entry.staged is not None and self.cluster is not None:
            self.cluster.drop(entry.staged)
        self.staged_bytes -= entry.staged_bytes
        entry.staged = entry.staged_generation = None
        entry.staged_bytes = 0

    def unstaged(self) -> list[Pending]:
        """Committed states not staged as they are now (only node-durable), in change order."""
        with self.lock:
            return sorted((entry for entry in self._pending.values()
                           if entry.durable and entry.staged_generation != entry.generation),
                          key=lambda entry: entry.seq)

    def pending_keys(self) -> set[tuple[str, str]]:
        """(source, key) of every pending state: newer here than any record of it that no
        pending state names."""
        with self.lock:
            return {(entry.source, entry.key) for entry in self._pending.values()}

    def staged_ids(self) -> set[str]:
        with self.lock:
            return {entry.staged for entry in self._pending.values() if entry.staged}

    def restage(self) -> int:
        """Stage every committed state that is only node-durable (a failed stage, a rename,
        a change of attributes), oldest change first; how many were staged. Stops at the
        first failure: the cluster is not answering. With nothing to stage after a failure,
        probes the cluster instead, so that commits stage again once it answers."""
        unstaged = self.unstaged()
        if not unstaged and self.cluster.failing_since is not None:
            self.cluster.probe()
        staged_count = 0
        for entry in unstaged:
            staged = self._stage(entry)
            if staged is None:
                break
            self._journal_staged([(entry, *staged)])
            staged_count += 1
        return staged_count
