"""Each control operation mapped to the part of the data path that answers it.

The operations and their fields are docs/ARCHITECTURE.md's "The control protocol"; the wire
format is `avafs/reader/control_socket.py` and the server that calls these handlers, each in
its connection's thread, `server.py`. A handler may wait (a warmup, a flush): it runs on a
control-socket thread, never on the FUSE loop, and holds no lock while it waits.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Protocol

from ..batch_reads.generation import InPlaceWatch
from ..batch_reads.serve import FileReads
from ..batch_reads.snapshot import LocationSnapshot
from ..errors import NEW_OBJECTS_HINT, AvafsError
from ..namespace import Namespace
from ..reader.control_socket import Progress
from ..snapshots.actions import perform
from ..snapshots.catalog import SnapshotCatalog
from ..snapshots.store import SnapshotStore
from ..stores.base import ObjectStore
from ..warmup.runner import Target, expand, snapshot_targets
from ..writeback.manager import WriteBack
from ..writeback.pending import Pending
from .server import Handler
from .status import StatusSource, build_status


class ControlSource(StatusSource, Protocol):
    """What the control operations reach of a mount: the daemon's `Filesystem` is one, and
    this module needs nothing else of it, so it imports no daemon code."""

    namespace: Namespace
    origins: dict[str, ObjectStore]
    writeback: WriteBack | None
    in_place: InPlaceWatch
    locations: LocationSnapshot


class ControlOperations:
    """The handlers of one mount's control socket, by operation name (`handlers`)."""

    def __init__(self, filesystem: ControlSource) -> None:
        self._filesystem = filesystem
        self.namespace = filesystem.namespace
        self.stack = filesystem.stack
        self.writeback = filesystem.writeback
        self.warmups = filesystem.warmups
        self.prefetcher = filesystem.prefetcher
        self.handlers: dict[str, Handler] = {
            "status": lambda request, progress: build_status(filesystem),
            "warmup": self._warmup,
            "prefetch": lambda request, progress: {
                "queued": self.prefetcher.submit(request["items"])},
            "evict": self._evict,
            "flush": self._flush,
            "refresh": self._refresh,
            "check": lambda request, progress: self.warmups.check(
                request["items"], str(request.get("tier", "disk"))),
            "read": FileReads(self.namespace, self.stack, self.writeback, filesystem.in_place,
                              filesystem.locations).handle,
            "list": self._list,
            "cached": self._cached,
            "snapshot": self._snapshot,
        }

    def _flush(self, request: dict, progress: Progress) -> dict:
        if self.writeback is None:
            return self._filesystem.dirty_status()
        selects = None
        if "path" in request:
            try:
                source, key, info = self.namespace.resolve(request["path"])
            except IsADirectoryError:  # the root of a mount of several sources: everything
                source, key, info = "", "", None
            except FileNotFoundError:
                raise AvafsError(f"cannot flush {request['path']}: not found in the mount") \
                    from None
            if source or key:
                def selects(entry: Pending) -> bool:
                    return entry.source == source and (
                        entry.key == key if info is not None else entry.key.startswith(key))
        return self.writeback.flush(progress, selects, request.get("limit"))

    def _refresh(self, request: dict, progress: Progress) -> dict:
        """Forgets cached listings and attributes under a path, the kernel's included.

        The kernel's entries are invalidated before the answer goes back, so a read right after
        `avafs refresh` finds what is new. Waiting is safe here: this runs on a control-socket
        thread, not in a FUSE request, and holds no lock a FUSE request takes."""
        import pyfuse3

        entries = self.namespace.refresh(request["path"])
        for parent, name in entries:
            with suppress(FileNotFoundError):
                pyfuse3.invalidate_entry(parent, os.fsencode(name))
        return {"entries": len(entries)}

    def _source_of(self, path: str) -> tuple[str, str]:
        """(source, key prefix) of a directory of the mount."""
        try:
            source, key, info = self.namespace.resolve(path)
        except IsADirectoryError:
            raise AvafsError("the root of a mount of several sources is no one source's "
                             "directory: name a directory under one of them") from None
        except FileNotFoundError:
            raise AvafsError(f"{path or '/'} not found in the mount ({NEW_OBJECTS_HINT})") \
                from None
        if info is not None:
            raise AvafsError(f"{path} is a file: snapshots are of directories")
        return source, key

    def _snapshot(self, request: dict, progress: Progress) -> dict:
        """`avafs snapshot ACTION PATH ...` for a path in the mount: on the catalog of the
        path's source as it is now (not a `--snapshot` record of it). `create` first uploads
        what was written under the path, so the snapshot records what readers see."""
        path = str(request.get("path", ""))
        source, key = self._source_of(path)
        answer = {}
        if request.get("action") == "create":
            flushed = self._flush({"path": path}, progress)
            if flushed["upload_queue"]:
                answer["not_uploaded"] = flushed["upload_queue"]
        catalog = SnapshotCatalog(self._filesystem.origins[source])
        return {**answer, **perform(catalog, request, key)}

    def _snapshot_targets(self, name: str, path: str) -> list[Target]:
        """The files snapshot `name` of the source of `path` records, each to be read as its
        recorded version: through this mount's own record where it serves that snapshot."""
        source, _ = self._source_of(path)
        store = self._filesystem.stores[source]
        if not (isinstance(store, SnapshotStore) and store.name == name):
            origin = self._filesystem.origins[source]
            store = SnapshotStore(origin, SnapshotCatalog(origin).load(name))
        return snapshot_targets("" if self.namespace.single_source else f"{source}/", store)

    def _warmup(self, request: dict, progress: Progress) -> dict:
        targets = None
        if request.get("snapshot"):
            targets = self._snapshot_targets(str(request["snapshot"]),
                                             str(request.get("path", "")))
        job = self.warmups.start(request.get("items", []), int(request.get("threads", 8)),
                                 str(request.get("tier", "disk")), targets)
        if not request.get("background"):
            while job.finished_at is None:
                progress(job.as_dict())
                self.warmups.wait(job, 0.5)
        return job.as_dict()

    def _list(self, request: dict, progress: Progress) -> dict:
        path = request["path"]
        try:
            return {"files": self.namespace.files_under(path)}
        except (FileNotFoundError, NotADirectoryError) as error:
            hint = f" ({NEW_OBJECTS_HINT})" if isinstance(error, FileNotFoundError) else ""
            raise AvafsError(f"cannot list {path or '/'} in the mount: "
                             f"{error.__class__.__name__}{hint}") from None

    def _cached(self, request: dict, progress: Progress) -> dict:
        """For each item, the share of its blocks the cache holds (None: not found)."""
        shares = []
        for item in request["items"]:
            targets = expand(self.namespace, [item], [])
            shares.append(self.stack.cached_share([target.ref for target in targets])
                          if targets else None)
        return {"shares": shares}

    def _evict(self, request: dict, progress: Progress) -> dict:
        failures: list[tuple[str, str]] = []
        targets = expand(self.namespace, request["items"], failures)
        blocks = sum(self.stack.evict(target.ref.source, target.ref.key) for target in targets)
        return {"files": len(targets), "blocks": blocks,
                "failures": [{"path": path, "error": error} for path, error in failures]}
