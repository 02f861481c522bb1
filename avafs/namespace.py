"""Path -> (source, key): the inode table and the listing cache.

Directories are key prefixes ('/' delimiter), with or without marker objects. Listings are the
unit of caching: a lookup is answered from the parent's cached listing (negative answers too),
so walking a directory costs one paginated LIST, not one request per file, and the listing is
trusted for `--metadata-ttl` seconds (forever with `--immutable`). Keys that cannot be paths
(`..`, empty segments, NUL, names over 255 bytes) are hidden and logged once, never followed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from .stores.base import ObjectInfo, ObjectStore
from .tiers.stack import ObjectRef

log = logging.getLogger(__name__)

ROOT_INODE = 1
_NAME_MAX = 255


@dataclass(slots=True)
class Entry:
    """A child in a directory listing: a sub-directory (info is None) or an object."""

    name: str
    info: ObjectInfo | None

    @property
    def is_dir(self) -> bool:
        return self.info is None


@dataclass(slots=True)
class Node:
    inode: int
    parent: int
    name: str
    source: str
    key: str
    """The object's key, or for a directory its prefix ('' or ending in '/')."""
    info: ObjectInfo | None
    checked_at: float
    lookups: int = 0
    kernel_cached_etag: str | None = None
    """The version whose pages the kernel may hold, so a re-open can keep them."""

    @property
    def is_dir(self) -> bool:
        return self.info is None


@dataclass(slots=True)
class _Listing:
    fetched_at: float
    entries: dict[str, Entry] = field(default_factory=dict)
    ordered: list[Entry] = field(default_factory=list)


def valid_name(name: str) -> bool:
    return (name not in ("", ".", "..") and "\0" not in name
            and len(name.encode("utf-8", "surrogateescape")) <= _NAME_MAX)


class Namespace:
    def __init__(self, stores: dict[str, ObjectStore], ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stores = stores
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[int, Node] = {}
        self._children: dict[tuple[int, str], int] = {}
        self._next_inode = ROOT_INODE + 1
        self._listings: dict[tuple[str, str], _Listing] = {}
        self._listing_loads: dict[tuple[str, str], Future[_Listing]] = {}
        self._reported: set[str] = set()
        self.single_source = set(stores) == {""}
        self._nodes[ROOT_INODE] = Node(ROOT_INODE, ROOT_INODE, "", "", "", None, math.inf, 1)
        if not self.single_source:
            root_entries = [Entry(name, None) for name in sorted(stores)]
            self._listings[("", "")] = _Listing(math.inf, {e.name: e for e in root_entries},
                                                root_entries)

    # --- nodes -------------------------------------------------------------------------------

    def node(self, inode: int) -> Node:
        return self._nodes[inode]

    def child(self, parent: Node, entry: Entry) -> Node:
        """The node for a listed entry, created on first sight; counts one kernel lookup."""
        with self._lock:
            inode = self._children.get((parent.inode, entry.name))
            node = self._nodes.get(inode) if inode else None
            if node is None or node.is_dir != entry.is_dir:
                node = self._new_node(parent, entry)
            elif entry.info is not None and node.info != entry.info:
                node.info = entry.info
            node.checked_at = self._clock()
            node.lookups += 1
            return node

    def _new_node(self, parent: Node, entry: Entry) -> Node:
        inode = self._next_inode
        self._next_inode += 1
        if parent.inode == ROOT_INODE and not self.single_source:
            source, key = entry.name, ""
        else:
            source = parent.source
            key = entry.info.key if entry.info else f"{parent.key}{entry.name}/"
        node = Node(inode, parent.inode, entry.name, source, key, entry.info, self._clock())
        self._nodes[inode] = node
        self._children[(parent.inode, entry.name)] = inode
        return node

    def forget(self, inode: int, count: int) -> None:
        with self._lock:
            node = self._nodes.get(inode)
            if node is None or inode == ROOT_INODE:
                return
            node.lookups -= count
            if node.lookups <= 0:
                del self._nodes[inode]
                if self._children.get((node.parent, node.name)) == inode:
                    del self._children[(node.parent, node.name)]

    def is_fresh(self, checked_at: float) -> bool:
        return self._clock() - checked_at < self.ttl

    # --- listings ----------------------------------------------------------------------------

    def cached_listing(self, source: str, prefix: str) -> _Listing | None:
        """The listing if it is cached and fresh (no I/O), else None."""
        listing = self._listings.get((source, prefix))
        if listing is not None and self.is_fresh(listing.fetched_at):
            return listing
        return None

    def listing(self, source: str, prefix: str) -> _Listing:
        """The directory's listing, fetched from the store when stale (blocks)."""
        cached = self.cached_listing(source, prefix)
        if cached is not None:
            return cached
        slot = (source, prefix)
        with self._lock:
            loading = self._listing_loads.get(slot)
            owner = loading is None
            if owner:
                loading = self._listing_loads[slot] = Future()
        if not owner:
            return loading.result()
        try:
            listing = self._fetch_listing(source, prefix)
            with self._lock:
                self._listings[slot] = listing
            loading.set_result(listing)
            return listing
        except BaseException as error:
            loading.set_exception(error)
            raise
        finally:
            with self._lock:
                self._listing_loads.pop(slot, None)

    def _fetch_listing(self, source: str, prefix: str) -> _Listing:
        fetched_at = self._clock()
        result = self.stores[source].list_dir(prefix)
        entries: dict[str, Entry] = {}
        skip = len(prefix)
        for sub_prefix in result.prefixes:
            name = sub_prefix[skip:-1]
            if self._acceptable(source, name, sub_prefix):
                entries[name] = Entry(name, None)
        for info in result.objects:
            name = info.key[skip:]
            if name == "" or info.key.endswith("/"):
                continue  # a directory marker object, or a key that cannot be a file
            if not self._acceptable(source, name, info.key):
                continue
            if name in entries:
                self._report(info.key, f"hiding object {info.key!r}: a directory of the same "
                             "name shadows it")
                continue
            entries[name] = Entry(name, info)
        ordered = sorted(entries.values(), key=lambda entry: entry.name)
        return _Listing(fetched_at, entries, ordered)

    def _acceptable(self, source: str, name: str, key: str) -> bool:
        if valid_name(name) and "/" not in name:
            return True
        self._report(key, f"hiding key {key!r} in {source or 'the source'}: it "
                     "cannot be a path (empty segment, '.', '..', NUL or a name over 255 bytes)")
        return False

    def _report(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.warning("%s", message)

    # --- lookups -----------------------------------------------------------------------------

    def lookup(self, parent: Node, name: str) -> Node | None:
        """The child called `name`, or None; lists the parent if its listing is stale."""
        entry = self.listing(parent.source, parent.key).entries.get(name)
        return self.child(parent, entry) if entry else None

    def revalidate(self, node: Node) -> ObjectInfo | None:
        """Current metadata of a file whose cached copy is older than the TTL (blocks)."""
        if node.info is None or self.is_fresh(node.checked_at):
            return node.info
        info = self.stores[node.source].head(node.key)
        with self._lock:
            node.info = info or node.info
            node.checked_at = self._clock()
        return info

    def object_ref(self, source: str, info: ObjectInfo) -> ObjectRef:
        """What the tiers read; blocks are named by the store's URL, not the directory name,
        so renaming a namespace entry keeps its cache and two sources never share blocks."""
        store = self.stores[source]
        return ObjectRef(store.url, store, info.key, info.etag, info.size)

    # --- paths, for the control plane ------------------------------------------------------

    def resolve(self, relative: str) -> tuple[str, str, ObjectInfo | None]:
        """(source, key, info) of a file or (source, prefix, None) of a directory, by its path
        relative to the mount; raises FileNotFoundError. Creates no inodes."""
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        source, prefix = "", ""
        if not self.single_source:
            if not parts:
                raise IsADirectoryError("the namespace root spans every source; name one")
            source = parts.pop(0)
            if source not in self.stores:
                raise FileNotFoundError(relative)
        for position, part in enumerate(parts):
            entry = self.listing(source, prefix).entries.get(part)
            if entry is None:
                raise FileNotFoundError(relative)
            if entry.info is not None:
                if position != len(parts) - 1:
                    raise FileNotFoundError(relative)
                return source, entry.info.key, entry.info
            prefix = f"{prefix}{part}/"
        return source, prefix, None

    def walk(self, source: str, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under a directory, depth first, in name order."""
        for entry in self.listing(source, prefix).ordered:
            if entry.info is not None:
                yield entry.info
            else:
                yield from self.walk(source, f"{prefix}{entry.name}/")

    def path_of_url(self, url: str) -> str:
        """The mount-relative path of `s3://bucket/key` (or file://) inside this namespace."""
        for name, store in self.stores.items():
            root = store.url.rstrip("/") + "/"
            if url.startswith(root):
                return f"{name}/{url[len(root):]}".lstrip("/")
        raise FileNotFoundError(f"{url} is in none of this mount's sources")
