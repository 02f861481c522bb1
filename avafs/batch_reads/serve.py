"""Whole-file reads in batches over the control socket, for readers of many small files.

Why: through FUSE every file costs a lookup, an open, a read, a flush and a release, each a
round trip through the kernel and pyfuse3's request loop; that caps the small files a second
a mount serves whatever the reader does, below what local disk serves
(`bench/probes.py pyfuse3-ceiling` measures the cap, see BENCHMARKS.md).
The training adapters read one-file samples here instead, one request per batch. The answer
is what reading each file through the mount gives: the same namespace and pending writes,
the same tiers and counters.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any

from ..config.cache_dir import DISK_TIER_DIR
from ..errors import AvafsError, ObjectChangedError
from ..namespace import Namespace
from ..objects import ObjectRef, parent_prefix
from ..reader.control_socket import WithPayload
from ..tiers.stack import Piece, TierStack
from ..writeback.manager import WriteBack
from ..writeback.pending import DATA, Pending
from .generation import InPlaceWatch
from .snapshot import LocationSnapshot

MAX_FILE = 64 * 2**20
"""Larger files are left to the mount (EFBIG), where they are read in pieces as they are used."""

KEEP_LOCATIONS_FOR = 60.0
"""Longest a reader may keep an in-place answer without asking again, even on an immutable
mount: each ask touches the block in the disk tier's LRU, so blocks in use stay warm."""

Plan = ObjectRef | Pending | OSError
"""Where a file's bytes are: a version in the tiers, a local file not yet uploaded, or an error."""

Read = Piece | Pending | OSError | AvafsError
"""A file's bytes, read or still to read (a local file not yet uploaded), or why it cannot be."""


class FileReads:
    def __init__(self, namespace: Namespace, stack: TierStack, writeback: WriteBack | None,
                 watch: InPlaceWatch, snapshot: LocationSnapshot) -> None:
        self.namespace = namespace
        self.stack = stack
        self.writeback = writeback
        self.watch = watch
        self.snapshot = snapshot

    def handle(self, request: dict[str, Any], progress: object) -> WithPayload:
        """The "read" control operation: {"paths": [...]} -> sizes, per-path errors (errno and
        message, by position) and the files' bytes one after the other.

        With "in_place": true, files the disk tier holds whole and checked are answered with
        their block file instead ("files": position -> [path relative to the cache dir, size])
        and left out of the bytes: a reader on this machine reads them itself, so the daemon's
        share of a warm sample is a lookup, not a copy through its one GIL and the socket.
        Such an answer also says how long it may be kept ("keep_for", seconds) and under
        which generation ("generation", see `generation.py`; absent: do not keep it).
        Answers that may be kept go to the snapshot for other readers too."""
        started = time.monotonic()
        generation, changes = self.watch.generation, self.watch.changes
        listings: dict = {}
        directories: set[tuple[str, str]] = set()
        plans: list[Plan | Read] = [self._plan(path, listings, directories)
                                    for path in request["paths"]]
        files: dict[str, tuple[str, int]] = {}
        if request.get("in_place"):
            refs = [(index, plan) for index, plan in enumerate(plans)
                    if isinstance(plan, ObjectRef)]
            checked = self.stack.checked_files([ref for _, ref in refs])
            for (index, ref), path in zip(refs, checked, strict=True):
                if path is not None:
                    files[str(index)] = (f"{DISK_TIER_DIR}/{path}", ref.size)
                    plans[index] = b""
        refs = [(index, plan) for index, plan in enumerate(plans)
                if isinstance(plan, ObjectRef)]
        for (index, _), read in zip(refs, self.stack.read_whole([ref for _, ref in refs]),
                                    strict=True):
            plans[index] = read
        payload: list[Piece] = []
        errors: dict[str, tuple[int, str]] = {}
        for index, plan in enumerate(plans):
            try:
                payload.append(self._read(plan))
            except OSError as error:
                payload.append(b"")
                errors[str(index)] = (error.errno or errno.EIO, error.strerror or str(error))
        result: dict[str, Any] = {"sizes": [len(data) for data in payload], "errors": errors,
                                  "files": files}
        if files:
            self.watch.watch(directories, listings)
            keep_for = min(KEEP_LOCATIONS_FOR, self.namespace.fresh_for(listings.values()))
            result["keep_for"] = keep_for
            if self.watch.changes == changes:
                result["generation"] = generation
                if keep_for > 0:
                    paths = request["paths"]
                    self.snapshot.add(generation, {paths[int(index)]: located
                                                   for index, located in files.items()},
                                      started + keep_for)
        return WithPayload(result, payload)

    def _plan(self, path: str, listings: dict, directories: set[tuple[str, str]]) -> Plan:
        """Where the file's bytes are now; an error (as a value) for what cannot be read.
        Adds the (source, prefix) of the file's directory to `directories`."""
        try:
            source, key, info = self.namespace.resolve(path, listings)
        except FileNotFoundError:
            return _error(errno.ENOENT)
        except IsADirectoryError:
            return _error(errno.EISDIR)
        except AvafsError as error:
            return OSError(errno.EIO, str(error))
        if info is None:
            return _error(errno.EISDIR)
        directories.add((source, parent_prefix(key)))
        state = self.writeback.get(source, key) if self.writeback is not None else None
        plan: ObjectRef | Pending
        if state is not None and state.kind == DATA:
            plan = state
        else:
            plan = self.namespace.renamed_from(source, key) or \
                self.namespace.object_ref(source, info)
        if plan.size > MAX_FILE:
            return OSError(errno.EFBIG, f"larger than {MAX_FILE} bytes: open it")
        return plan

    def _read(self, read: Read) -> Piece:
        if isinstance(read, (bytes, memoryview)):
            return read
        if isinstance(read, OSError):
            raise read
        if isinstance(read, ObjectChangedError):
            raise OSError(errno.ESTALE, str(read))
        if isinstance(read, AvafsError):
            raise OSError(errno.EIO, str(read))
        return self._read_local(read)

    def _read_local(self, state: Pending) -> bytes:
        """A file written and not yet uploaded: its local data file, held open against an
        unlink or rename meanwhile, as an open file handle holds it."""
        path = self.writeback.data_path(state)
        if path is None:
            return b""
        self.writeback.hold_file(state.file)
        try:
            with open(path, "rb", buffering=0) as file:
                return file.readall()
        finally:
            self.writeback.drop_file(state.file)


def _error(number: int) -> OSError:
    return OSError(number, os.strerror(number))
