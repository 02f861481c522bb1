"""What a file or directory is now: its metadata under pending writes, its attributes read
from its object (a file's) or marker (a directory's), revalidation after the TTL, and what
the store has once an upload settles; a part of Namespace (__init__.py)."""

from __future__ import annotations

import logging
import time

from ..errors import StoreError
from ..objects import ObjectRef, parent_prefix
from ..stores.base import ObjectInfo
from ..writeback.pending import COPY, DELETED, Pending
from .listings import DESCRIBE_PAUSE, settle_into
from .nodes import Entry, Node, richer

log = logging.getLogger(__name__)


class Metadata:
    def current_info(self, node: Node) -> ObjectInfo | None:
        """A file's metadata as the mount shows it now: its pending write, else the latest
        listing (updated when an upload settles), else what the node was created with."""
        if node.info is None or self.writeback is None:
            return self.info_with(node, None)
        return self.info_with(node, self.writeback.get(node.source, node.key))

    def info_with(self, node: Node, pending: Pending | None,
                  listed_in: str | None = None) -> ObjectInfo | None:
        """`current_info` for a caller that has looked up the file's write-back state
        (`pending`) itself, as the attributes of every entry of every readdir do; a readdir
        also knows the prefix of the listing that named the file (`listed_in`), which spares
        deriving it from the key for each entry. A wrong one only misses the listing."""
        if node.info is None:
            return None
        if pending is not None and pending.kind != DELETED:
            return self.writeback.info(pending)
        prefix = parent_prefix(node.key) if listed_in is None else listed_in
        listing = self._listings.get((node.source, prefix))
        if listing is not None:
            entry = listing.entries.get(node.name)
            if entry is not None and entry.info is not None and entry.info.key == node.key:
                return richer(entry.info, node.info)
        return node.info

    def describe(self, node: Node) -> ObjectInfo | None:
        """A file's metadata with its attributes (mtime, mode, owner) read from the object,
        one HEAD the first time they are needed; kept in the node (blocks). A file gone from
        the store keeps what the listing said until its listing is fetched again. Reads of
        cached files go on while the store is down: a failed HEAD shows the listing's
        attributes, and no HEAD is tried for a while after one failed."""
        info = self.current_info(node)
        if info is None or info.attrs is not None or self.describe_paused():
            return info
        try:
            found = self._head_for_attributes(node)
        except StoreError:
            return info
        if found is None:
            return info
        return self.described(node, info, found)

    def described(self, node: Node, listed: ObjectInfo, found: ObjectInfo) -> ObjectInfo:
        """`found`, read from the store (a HEAD, or the GET of a small file's bytes), is what
        the file `listed` showed is now, attributes read: the node and its listing show it
        from now on, and a later mount knows it (`known`)."""
        with self._lock:
            node.info = found
        return self.learned(node.source, listed, found)

    def learned(self, source: str, listed: ObjectInfo, found: ObjectInfo) -> ObjectInfo:
        """`described` for a file that may have no node yet (a warmup's): its cached listing
        shows `found` from now on, which a node of it then shows (`richer`), and a later
        mount knows it."""
        prefix = parent_prefix(listed.key)
        name = listed.key[len(prefix):]
        listing = self._listings.get((source, prefix))
        with self._lock:
            entry = listing.entries.get(name) if listing is not None else None
            if entry is not None and entry.info is not None and entry.info.key == listed.key:
                listing.put(Entry(name, found))
        if self.known is not None:
            self.known.remember(self.stores[source].url, listed.key, listed, found)
        return found

    def describe_paused(self) -> bool:
        """Whether attributes are not read from the store for now: a read of them failed
        moments ago (DESCRIBE_PAUSE)."""
        return self._clock() < self._describe_paused_until

    def _head_for_attributes(self, node: Node) -> ObjectInfo | None:
        """One quick HEAD of a file's object or a directory's marker (`node.key`). A store that
        fails it pauses every such HEAD for DESCRIBE_PAUSE seconds, said once in the log, and
        the error is raised for the caller to show what it had."""
        try:
            return self.stores[node.source].head_quickly(node.key)
        except StoreError as error:
            self.pause_describing(node, error)
            raise

    def pause_describing(self, node: Node, error: StoreError) -> None:
        """Reading `node`'s attributes failed: none are read for DESCRIBE_PAUSE seconds,
        said once in the log."""
        self._describe_paused_until = self._clock() + DESCRIBE_PAUSE
        log.warning("cannot read the attributes of %s (%s); showing defaults for %.0fs",
                    node.key, error, DESCRIBE_PAUSE)

    def directory_info(self, node: Node) -> ObjectInfo | None:
        """A directory's marker as the mount shows it: its pending state (a mkdir, a change
        of attributes), else the stored marker read last (no I/O)."""
        if self.writeback is not None and node.key:
            state = self.writeback.get(node.source, node.key)
            if state is not None and state.kind != DELETED:
                return self.writeback.info(state)
        return node.marker

    def describe_directory(self, node: Node) -> ObjectInfo | None:
        """`directory_info`, the stored marker read first where it was not read within the
        TTL: from the directory's cached listing where that shows the marker's absence or its
        attributes, else with one HEAD (blocks). A store that does not answer leaves what was
        read before, as `describe` does for files."""
        if not node.key or self.is_fresh(node.marker_read_at) or self.describe_paused() or \
                self.marker_from_listing(node):
            return self.directory_info(node)
        try:
            found = self._head_for_attributes(node)
        except StoreError:
            return self.directory_info(node)
        with self._lock:
            node.marker, node.marker_read_at = found, self._clock()
        listing = self._fresh_store_listing(node.source, node.key)
        if self.known is not None and found is not None and listing is not None and \
                listing.marker is not None:
            self.known.remember(self.stores[node.source].url, node.key, listing.marker, found)
        return self.directory_info(node)

    def marker_from_listing(self, node: Node) -> bool:
        """Whether the directory's cached listing tells its marker: that it has none, or its
        attributes (a file:// listing); then the node keeps that, as read when the listing
        was (no I/O, so a lookup needs no thread for it)."""
        listing = self._fresh_store_listing(node.source, node.key)
        if listing is None or (listing.marker is not None and listing.marker.attrs is None):
            return False
        with self._lock:
            node.marker, node.marker_read_at = listing.marker, listing.fetched_at
        return True

    def subdirectories(self, node: Node) -> int | None:
        """How many subdirectories a directory has, where its listing is cached (no I/O)."""
        listing = self._listings.get((node.source, node.key))
        if listing is None:
            return None
        if self.writeback is None or not self.writeback.has_children(node.source, node.key):
            return listing.subdirectories
        return self._subdirectories_with_pending(listing, node.source, node.key)

    def entries_changed(self, directory: Node) -> None:
        """This mount created, removed or renamed an entry of `directory` (see the node's
        `entries_changed_at`)."""
        directory.entries_changed_at = time.time()

    def marker_info(self, source: str, prefix: str) -> ObjectInfo | None:
        """The stored marker of a directory the kernel has a node for (no I/O)."""
        with self._lock:
            node = self._node_named(source, prefix)
        return node.marker if node is not None else None

    def listed_info(self, source: str, key: str) -> ObjectInfo | None:
        """A file's info in its directory's cached listing, if there is one (no I/O)."""
        listing = self._listings.get((source, parent_prefix(key)))
        entry = listing.entries.get(key[len(parent_prefix(key)):]) if listing else None
        return entry.info if entry is not None and entry.info is not None and \
            entry.info.key == key else None

    def settled(self, source: str, key: str, info: ObjectInfo | None) -> None:
        """The store now has `info` for `key` (None: deleted), and the key's pending state goes:
        what the mount shows of it must be the store's version from now on. That is in the
        directory's cached listing; in a listing being fetched, whose answer may predate the
        upload and must not bring back the version before it (nor hide a file a pending copy
        showed); and in the file's node, which names the pending state's local version if it
        was looked up while the state was pending, in a directory never listed (a lookup after
        a remount): no store has that version, so reading it would fail. The attributes it
        was uploaded with are known to later mounts (`known`)."""
        slot = (source, parent_prefix(key))
        with self._lock:
            if slot in self._listing_loads:
                self._settled_while_loading.setdefault(slot, []).append((key, info))
            node = self._node_named(source, key) if info is not None or \
                key.endswith("/") else None
            if node is not None and key.endswith("/"):
                node.marker, node.marker_read_at = info, self._clock()
            elif node is not None:
                node.info, node.checked_at = info, self._clock()
            listing = self._listings.get(slot)
            if listing is not None:
                settle_into(listing, key, info)
        if self.known is not None:
            self.known.remember(self.stores[source].url, key, None, info)
        if listing is not None:
            self.on_changed(source, key)

    def revalidate(self, node: Node) -> ObjectInfo | None:
        """Current metadata of a file whose cached copy is older than the TTL (blocks); a
        file with a pending change is what the mount has, whatever the store says; the cached
        metadata, stale, when the store does not answer (a refusal is raised)."""
        if node.info is None or self.is_fresh(node.checked_at):
            return node.info
        if self.writeback is not None:
            state = self.writeback.get(node.source, node.key)
            if state is not None and state.kind != DELETED:
                return self.writeback.info(state)
        store = self.stores[node.source]
        try:
            if store.unreachable_since is not None:
                raise StoreError(f"{store.url} is unreachable")
            info = store.head(node.key)
        except StoreError as error:
            if error.permanent:
                raise
            log.warning("%s; using the metadata of %r cached %.0fs ago", error, node.key,
                        self._clock() - node.checked_at)
            return node.info
        with self._lock:
            node.info = info or node.info
            node.checked_at = self._clock()
        return info

    def renamed_from(self, source: str, key: str) -> ObjectRef | None:
        """For a file renamed while its copy in the store is pending, the version it was
        renamed from: what reading the file means until the copy lands."""
        state = self.writeback.get(source, key) if self.writeback is not None else None
        if state is None or state.kind != COPY:
            return None
        store = self.stores[source]
        return ObjectRef(store.url, store, state.copy_from, state.copy_etag, state.size)

    def object_ref(self, source: str, info: ObjectInfo) -> ObjectRef:
        """What the tiers read; blocks are named by the store's URL, not the directory name,
        so renaming a namespace entry keeps its cache and two sources never share blocks."""
        store = self.stores[source]
        return ObjectRef(store.url, store, info.key, info.etag, info.size)
