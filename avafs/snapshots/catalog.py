"""A source's snapshots: made, found, listed and deleted under its `SNAPSHOTS_PREFIX`.

Making one costs one recursive listing of the recorded directory (with versions where the
bucket keeps them: `ObjectStore.walk_versions`) and one PUT of the record, which S3 and the
`file://` store (a temporary file renamed into place) both make atomic: a reader finds the
whole record or none. Whether the name is taken is asked just before the PUT (a HEAD), so two
commands making the same name at the same moment may both succeed, the later one winning.
"""

from __future__ import annotations

import io
import time

from ..errors import AvafsError, ObjectChangedError
from ..stores.base import SNAPSHOTS_PREFIX, ObjectStore
from .record import HEADER_READ, Snapshot, Summary, check_name, decode, decode_summary, encode, make


class SnapshotCatalog:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def _where(self, name: str) -> str:
        return f"{self.store.url.rstrip('/')}/{SNAPSHOTS_PREFIX}{name}"

    def create(self, name: str, prefix: str = "") -> Summary:
        """Record every file under `prefix` ('' or ending in '/') as snapshot `name`."""
        key = SNAPSHOTS_PREFIX + check_name(name)
        if self.store.head(key) is not None:
            made = self.load(name).summary.created
            raise AvafsError(f"snapshot {name!r} exists already in {self.store.url} (made "
                             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(made))}): "
                             "pick another name, or delete it first with 'avafs snapshot "
                             "delete'")
        created = time.time()
        found = [(info, version) for info, version in self.store.walk_versions(prefix)
                 if not info.key.startswith(SNAPSHOTS_PREFIX)]
        snapshot = make(name, self.store.url, prefix, created, found)
        data = encode(snapshot)
        self.store.put(key, io.BytesIO(data), len(data))
        return snapshot.summary

    def summaries(self) -> list[Summary]:
        """Every snapshot's summary, oldest first: one LIST and one short read per snapshot."""
        found = []
        for info in self.store.list_dir(SNAPSHOTS_PREFIX).objects:
            if info.key.endswith("/") or not info.size:
                continue
            try:
                start = self.store.get_range(info.key, 0, min(info.size, HEADER_READ),
                                             info.etag)
            except ObjectChangedError:  # deleted or replaced since the listing
                continue
            found.append(decode_summary(start, self._where(info.key[len(SNAPSHOTS_PREFIX):])))
        return sorted(found, key=lambda summary: (summary.created, summary.name))

    def load(self, name: str) -> Snapshot:
        key = SNAPSHOTS_PREFIX + check_name(name)
        info = self.store.head(key)
        if info is None:
            raise self._unknown(name)
        return decode(self.store.get_range(key, 0, info.size, info.etag), self._where(name))

    def delete(self, name: str) -> Summary:
        summary = self.load(name).summary
        self.store.delete(SNAPSHOTS_PREFIX + name)
        return summary

    def _unknown(self, name: str) -> AvafsError:
        names = [summary.name for summary in self.summaries()]
        known = (f"its snapshots are {', '.join(names)}" if names else
                 "it has none: make one with 'avafs snapshot create PATH NAME'")
        return AvafsError(f"no snapshot {name!r} in {self.store.url}: {known}")
