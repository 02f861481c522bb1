"""Namespace changes (unlink, mkdir and special files, rmdir, rename) as pending states, each
change journaled as one synced batch before it returns; a part of WriteBack (manager.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs
from .pending import COPY, DATA, DELETED, Pending

log = logging.getLogger(__name__)


class NamespaceChanges:
    def _replace(self, changes: list[Pending], removed: list[Pending] = ()) -> None:
        """Journal and index several states at once (one synced batch)."""
        if not changes and not removed:
            return  # an empty batch would never be written, and its wait never end
        self.journal.save(changes, [entry for entry in removed])
        for entry in removed:
            self._unindex(entry)
        for entry in changes:
            entry.durable = True
            self._index(entry)
        self._account()
        self.changed.notify_all()
        self._wake_uploader(len(changes))
        if self.sync_uploads:
            self.lock.release()
            try:
                self.wait_settled(changes)
            finally:
                self.lock.acquire()

    def unlink(self, source: str, key: str) -> None:
        with self.lock:
            changes = [self._next(source, key, DELETED)]
            self._replace(changes)
        self._stage_change(changes)

    def make_empty(self, source: str, key: str, attrs: Attrs | None = None) -> None:
        """A directory marker (`key` ends in '/') or a special file (`attrs.file_type`): an
        object whose metadata is all it holds, journaled before this returns."""
        with self.lock:
            changes = [self._next(source, key, DATA, attrs=attrs)]
            self._replace(changes)
        self._stage_change(changes)

    def rmdir(self, source: str, prefix: str) -> None:
        """The marker goes after every pending change below it (a local bucket cannot remove
        a directory that still holds files)."""
        with self.lock:
            below = tuple(key for (entry_source, key) in self._pending
                          if entry_source == source and key.startswith(prefix) and key != prefix)
            changes = [self._next(source, prefix, DELETED, wait_for=below)]
            self._replace(changes)
        self._stage_change(changes)

    def rename(self, source: str, moves: list[tuple[str, str]], markers: list[tuple[str, str]],
               clean_info: Callable[[str], ObjectInfo | None], renamed: str) -> None:
        """Move keys (old, new) and directory markers (old prefix, new prefix) in one journal
        batch, so a crash leaves the whole rename or none of it. A key with no pending state
        is clean: `clean_info` gives its store info, asked under the lock, as an upload may
        have settled since the caller listed it (for a marker: what is known of it, or None).
        The entry renamed itself (`renamed`, its old key or prefix) gets a new ctime where its
        attributes are known; what moves with a directory keeps its own.

        Written data moves as the same state under its new key, so the handles open on it
        (which hold that state) go on writing what the new key shows and uploads; a new
        generation stops an upload of it to the old key from settling it."""
        with self.lock:
            changes: list[Pending] = []
            removed: list[Pending] = []
            rekeyed: list[tuple[Pending, str, int, Attrs | None]] = []
            changed_at = time.time()
            for old, new in moves:
                current = self._pending.get((source, old))
                if current is not None and current.kind == DATA:
                    rekeyed.append((current, current.key, current.seq, current.attrs))
                    current.key, current.seq = new, next(self._seq)
                    if old == renamed:
                        current.attrs = replace(current.attrs or Attrs(), ctime=changed_at)
                    current.generation += 1
                    # Indexing it under `new` first keeps its file: the deletion that takes
                    # its old key's place releases only the old key's hold.
                    changes += [current, self._next(source, old, DELETED)]
                elif current is not None and current.kind == COPY and \
                        current.copy_from == new:
                    # Renamed back before its copy landed: the store still has the version
                    # (nothing changes a key a copy reads), so the key needs no change.
                    if (source, new) in self._pending:
                        removed.append(self._pending[(source, new)])
                    changes.append(self._next(source, old, DELETED))
                elif current is not None and current.kind == COPY:
                    # A change of attributes copies `old` onto itself: the copy to `new` reads it.
                    changes += [self._next(source, new, COPY, size=current.size,
                                           mtime=current.mtime, copy_from=current.copy_from,
                                           copy_etag=current.copy_etag, attrs=current.attrs),
                                self._next(source, old, DELETED, wait_for=(
                                    (new,) if current.copy_from == old else ()))]
                elif current is None and (clean := clean_info(old)) is not None:
                    attrs = clean.attrs
                    if attrs is not None and old == renamed:
                        attrs = replace(attrs, ctime=changed_at)
                    changes += [self._next(source, new, COPY, size=clean.size, mtime=clean.mtime,
                                           copy_from=old, copy_etag=clean.etag, attrs=attrs),
                                self._next(source, old, DELETED, wait_for=(new,))]
            for old, new in sorted(markers, key=lambda marker: -marker[0].count("/")):
                below = tuple(entry.key for entry in changes
                              if entry.key.startswith(old) and entry.key != old)
                current = self._pending.get((source, old))
                marker = self.info(current) if current is not None and current.kind == DATA \
                    else clean_info(old)
                attrs = None if marker is None else marker.attrs
                if attrs is not None and old == renamed:
                    attrs = replace(attrs, ctime=changed_at)
                changes += [self._next(source, new, DATA, mtime=marker.mtime if marker else
                                       changed_at, attrs=attrs),
                            self._next(source, old, DELETED, wait_for=below)]
            try:
                self._replace(changes, removed)
            except BaseException:  # not journaled: the moved states keep their old keys
                for entry, key, seq, attrs in rekeyed:
                    entry.key, entry.seq, entry.attrs = key, seq, attrs
                raise
        self._stage_change(changes)
