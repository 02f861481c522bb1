"""Path -> (source, key): the inode table and the listing cache, and the namespace changes of a
writable mount (mkdir, rmdir, rename) checked as POSIX has them and planned here, so the FUSE
operations only translate requests and answers.

Directories are key prefixes ('/' delimiter), with or without marker objects. Listings are the
unit of caching: a lookup is answered from the parent's cached listing (negative answers too),
so walking a directory costs one paginated LIST, not one request per file, and the listing is
trusted for `--metadata-ttl` seconds (forever with `--immutable`). Keys that cannot be paths
(`..`, empty segments, NUL, names over 255 bytes) are hidden and logged once, never followed.

A store that does not answer never holds a lookup for long: listings are fetched by a pool of
their own, and a caller with nothing cached waits for one at most `store_wait` seconds. One
with a listing cached before, however old, waits at most STALE_WAIT and then gets that listing
(a directory this mount created and has not uploaded yet counts as listed: empty), while the fetch goes on and updates the
cache when it ends: a path of several directories costs a few of these waits, not a few
request limits. Callers of the same fetch share its wait, counted from the first; none waits
for a store known to be unreachable (for longer than `store_wait` where nothing is cached: a
blip must not make existing names read as absent). With no cached listing, a directory of a store that is unreachable
(not one that refused) reads as holding nothing the mount did not write itself: the guess
that lets `mkdir` and creating files go on during an outage; the store's own entries appear
when it answers again.

A walk (`os.walk`, a dataset's class folders read one after another) lists a directory's
subdirectories one by one in name order, each a round trip to the store. So when a directory
is listed for a caller, the next LIST_AHEAD subdirectories after it in its parent's listing
are fetched too, by a pool of their own (a store that hangs holds up those threads, never a
caller's own listing); the first caller of such a listing moves the window on
(`_list_ahead`). A walk then waits for about one LIST in every LIST_AHEAD; what it costs a
caller that stops early is that many LISTs more.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout
from dataclasses import dataclass, field

from .errors import StoreError
from .objects import ObjectRef, parent_prefix
from .stores.base import ObjectInfo, ObjectStore
from .stores.metadata import Attrs
from .writeback.manager import WriteBack
from .writeback.pending import COPY, DELETED, Pending

log = logging.getLogger(__name__)

ROOT_INODE = 1
NAME_MAX = 255
_DESCRIBE_PAUSE = 10.0
"""Seconds no file's attributes are read from the store after a read of them failed, or a
listing did not come in time and its cached one was served."""
_LISTERS = 8
"""Listings fetched at once; more wait in the pool's queue, their callers bounded as ever."""
STALE_WAIT = 1.0
"""Seconds a lookup waits for a fresh listing before it uses the stale one."""
LIST_AHEAD = 8
"""Subdirectories listed ahead of a walk (module docstring), and the threads that list them."""
_AHEAD_SCAN = 64
"""Entries after a directory in its parent's listing looked through for the subdirectories
to list ahead: files between them are skipped, up to this many."""
RETIRED_INODES = 100_000
"""Inode numbers of forgotten entries kept for their names (`Namespace.forget`); past it the
oldest are dropped, and those names get new numbers when they are looked up again."""


class ListingUnavailable(StoreError):
    """A directory's listing could not be had from a store that does not answer, and none is
    cached (transient: a later lookup asks again)."""


class Refused(OSError):
    """A change POSIX refuses (the name exists, a directory is not empty, ...): the errno is
    the whole answer, and nothing failed that the log should tell."""


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
    marker: ObjectInfo | None = None
    """A directory's marker object (`key`, ending in '/') as the store has it, with the
    directory's attributes; None where it has none or it was not read (`marker_read_at`)."""
    marker_read_at: float = -math.inf
    entries_changed_at: float | None = None
    """When this mount last created, removed or renamed an entry of the directory: its mtime
    and ctime from then on, in memory only (a marker written per new file would cost a
    request each)."""
    link_target: tuple[str, bytes] | None = None
    """A symbolic link's (etag, target), read once per version."""

    @property
    def is_dir(self) -> bool:
        return self.info is None


@dataclass(slots=True)
class _Listing:
    fetched_at: float
    entries: dict[str, Entry] = field(default_factory=dict)
    _ordered: list[Entry] | None = None
    _subdirectories: int | None = None
    listed_ahead: bool = False
    """Fetched ahead of a walk and not asked for since: its first caller moves the window."""
    marker: ObjectInfo | None = None
    """The directory's own marker object as the listing showed it; None: it has none."""

    @property
    def subdirectories(self) -> int:
        if self._subdirectories is None:
            self._subdirectories = sum(entry.is_dir for entry in self.entries.values())
        return self._subdirectories

    @property
    def ordered(self) -> list[Entry]:
        """Entries by name; sorted on demand so single-entry updates stay O(1)."""
        if self._ordered is None:
            self._ordered = sorted(self.entries.values(), key=lambda entry: entry.name)
        return self._ordered

    def put(self, entry: Entry) -> None:
        self.entries[entry.name] = entry
        self._ordered = self._subdirectories = None

    def drop(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self._ordered = self._subdirectories = None


@dataclass(slots=True)
class RenamePlan:
    """A rename checked and planned (its directories listed), not yet made."""

    source: str
    old_parent: Node
    old_name: str
    new_parent: Node
    new_name: str
    old_key: str
    new_key: str
    """The renamed file's key, or the renamed directory's prefix, before and after."""
    is_dir: bool
    moves: list[tuple[str, str, Entry]]
    """(old key, new key, entry as listed) of every file that moves."""
    markers: list[tuple[str, str]]
    """(old prefix, new prefix) of every directory that moves."""
    renamed: Node | None
    """The node of the renamed file or directory, if the kernel has one."""
    replaced: Node | None
    """The node of what the rename replaces (a file, or an empty directory), if any."""

    def takes_key_of(self, node: Node) -> bool:
        """Whether the rename takes the node's key away from it: the renamed file's node, or
        any node under the renamed directory (their readers may need a local copy first)."""
        if self.is_dir:
            return node.source == self.source and node.key.startswith(self.old_key)
        return node is self.renamed


def _richer(listed: ObjectInfo, known: ObjectInfo | None) -> ObjectInfo:
    """A listing's entry, or what is known of the same version with its attributes read: a
    listing carries no metadata, so listing a directory again must not forget them."""
    if known is not None and known.attrs is not None and listed.attrs is None and \
            known.etag == listed.etag and known.key == listed.key:
        return known
    return listed


def _settle_into(listing: _Listing, key: str, info: ObjectInfo | None) -> None:
    """Show in a directory's listing what the store now has for `key` (None: deleted)."""
    name = key[len(parent_prefix(key)):].rstrip("/")
    if info is not None:
        listing.put(Entry(name, None if key.endswith("/") else info))
    else:  # a removed directory marker settles after everything that was under it
        current = listing.entries.get(name)
        if current is not None and current.is_dir == key.endswith("/"):
            listing.drop(name)


def valid_name(name: str) -> bool:
    return (name not in ("", ".", "..") and "\0" not in name
            and len(name.encode("utf-8", "surrogateescape")) <= NAME_MAX)


class Namespace:
    def __init__(self, stores: dict[str, ObjectStore], ttl: float,
                 writeback: WriteBack | None = None, store_wait: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stores = stores
        self.writeback = writeback
        self.ttl = ttl
        self.store_wait = store_wait
        self._clock = clock
        self._listers = ThreadPoolExecutor(_LISTERS, thread_name_prefix="avafs-list")
        self._ahead_listers = ThreadPoolExecutor(LIST_AHEAD,
                                                 thread_name_prefix="avafs-list-ahead")
        self.on_changed: Callable[[str, str], None] = lambda source, key: None
        """Called with (source, key) when a settled upload changes a cached listing."""
        self._lock = threading.Lock()
        self._nodes: dict[int, Node] = {}
        self._children: dict[tuple[int, str], int] = {}
        self._retired: dict[tuple[int, str], tuple[int, bool]] = {}
        """(parent inode, name) -> (inode, is a directory) of entries the kernel forgot, in
        the order it forgot them: the kernel's copy of a directory read to its end
        (`cache_readdir`) still names them with these numbers, and keeps naming them while
        the directory is unchanged, so a name looked up again gets its number back."""
        self._next_inode = ROOT_INODE + 1
        self._listings: dict[tuple[str, str], _Listing] = {}
        self._listing_loads: dict[tuple[str, str], tuple[float, Future[_Listing]]] = {}
        """Fetches in flight, by directory, with the time their first caller began waiting."""
        self._settled_while_loading: dict[tuple[str, str],
                                          list[tuple[str, ObjectInfo | None]]] = {}
        """(key, info) of the uploads that settled in a directory while its listing was being
        fetched, in order: the fetched listing may not have them yet."""
        self._reported: set[str] = set()
        self._describe_paused_until = -math.inf
        self.single_source = set(stores) == {""}
        self._nodes[ROOT_INODE] = Node(ROOT_INODE, ROOT_INODE, "", "", "", None, math.inf, 1)
        if not self.single_source:
            self._listings[("", "")] = _Listing(math.inf, {name: Entry(name, None)
                                                           for name in stores})

    # --- nodes -------------------------------------------------------------------------------

    def node(self, inode: int) -> Node:
        return self._nodes[inode]

    def child(self, parent: Node, entry: Entry) -> Node:
        """The node for a listed entry, created on first sight; counts one kernel lookup."""
        with self._lock:
            inode = self._children.get((parent.inode, entry.name))
            node = self._nodes.get(inode) if inode else None
            if node is None or (node.info is None) != (entry.info is None):
                node = self._new_node(parent, entry)
            elif entry.info is not None and node.info is not entry.info and \
                    node.info != entry.info:
                node.info = _richer(entry.info, node.info)
            node.checked_at = self._clock()
            node.lookups += 1
            return node

    def _new_node(self, parent: Node, entry: Entry) -> Node:
        retired = self._retired.pop((parent.inode, entry.name), None)
        if retired is not None and retired[1] == entry.is_dir and retired[0] not in self._nodes:
            inode = retired[0]
        else:
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

    def node_of(self, parent: Node, name: str) -> Node | None:
        inode = self._children.get((parent.inode, name))
        return self._nodes.get(inode) if inode else None

    def detach(self, node: Node) -> None:
        """The file was deleted or renamed over: its name now names a new inode, not this one,
        which lives on (if open) until the kernel forgets it."""
        with self._lock:
            if self._children.get((node.parent, node.name)) == node.inode:
                del self._children[(node.parent, node.name)]

    def forget(self, inode: int, count: int) -> bool:
        """Takes back `count` kernel lookups; whether the inode is gone now, so whatever a
        caller keeps per inode can go with it. An inode number comes back only for the name
        it had in the same directory (`_retired`), and only once the kernel forgot it: the
        kernel's cached listing of the directory may name the entry with it, and a lookup
        that gave the name a new number would contradict that listing. A name deleted or
        renamed over (`detach`) gives its number to no one."""
        with self._lock:
            node = self._nodes.get(inode)
            if node is None or inode == ROOT_INODE:
                return node is None
            node.lookups -= count
            if node.lookups <= 0:
                del self._nodes[inode]
                if self._children.get((node.parent, node.name)) == inode:
                    del self._children[(node.parent, node.name)]
                    self._retired[(node.parent, node.name)] = (inode, node.is_dir)
                    if len(self._retired) > RETIRED_INODES:
                        del self._retired[next(iter(self._retired))]
                return True
            return False

    def is_fresh(self, checked_at: float) -> bool:
        return self._clock() - checked_at < self.ttl

    def fresh_for(self, listings: Iterable[_Listing]) -> float:
        """Seconds until the oldest of these listings is fetched again (inf: never)."""
        return min(listing.fetched_at for listing in listings) + self.ttl - self._clock()

    # --- listings ----------------------------------------------------------------------------

    def _fresh_store_listing(self, source: str, prefix: str) -> _Listing | None:
        listing = self._listings.get((source, prefix))
        if listing is not None and self.is_fresh(listing.fetched_at):
            return listing
        return None

    def cached_listing(self, source: str, prefix: str) -> _Listing | None:
        """The directory as the mount shows it, if that needs no I/O, else None."""
        listing = self._fresh_store_listing(source, prefix)
        return None if listing is None else self._with_pending(listing, source, prefix)

    def listing(self, source: str, prefix: str) -> _Listing:
        """The directory as the mount shows it: the store's listing under pending writes. A
        directory this mount created while the store was unreachable lists what was written
        in it; any other that cannot be listed raises."""
        try:
            listing = self._store_listing(source, prefix)
        except ListingUnavailable:
            if not self._created_here(source, prefix):
                raise
            listing = _Listing(self._clock())
        return self._with_pending(listing, source, prefix)

    def _with_pending(self, listing: _Listing, source: str, prefix: str) -> _Listing:
        pending = self.writeback.children(source, prefix) if self.writeback else ()
        if not pending:
            return listing
        merged = _Listing(listing.fetched_at, dict(listing.entries))
        for state in pending:
            name = state.key[len(prefix):].rstrip("/")
            visible = self._pending_entry(name, state)
            if visible is not None:
                merged.put(visible)
            elif state.key.endswith("/") == (merged.entries.get(name, Entry(name, None)).is_dir):
                merged.drop(name)
        return merged

    def _pending_entry(self, name: str, state: Pending) -> Entry | None:
        if state.kind == DELETED:
            return None
        if state.key.endswith("/"):
            return Entry(name, None)
        return Entry(name, self.writeback.info(state))

    def _store_listing(self, source: str, prefix: str) -> _Listing:
        """The store's listing of a directory, fetched when stale (blocks, boundedly: see the
        module's docstring). Raises ListingUnavailable when the store does not answer and
        nothing is cached, StoreError when it refuses."""
        cached = self._fresh_store_listing(source, prefix)
        if cached is not None:
            if cached.listed_ahead:
                cached.listed_ahead = False
                self._list_ahead(source, prefix)
            return cached
        slot = (source, prefix)
        with self._lock:
            started, loading = self._listing_loads.get(slot, (None, None))
            if loading is None:
                started = self._clock()
                loading = self._listers.submit(self._load_listing, slot)
                self._listing_loads[slot] = (started, loading)
            stale = self._listings.get(slot)
        self._list_ahead(source, prefix)
        short = stale is not None or self._created_here(source, prefix)
        wait = min(STALE_WAIT, self.store_wait) if short else self.store_wait
        wait -= self._clock() - started
        down_since = self.stores[source].unreachable_since
        if down_since is not None and (stale is not None
                                       or self._clock() - down_since > self.store_wait):
            wait = 0.0
        try:
            return loading.result(timeout=max(0.0, wait))
        except (WaitTimeout, StoreError) as error:
            if isinstance(error, StoreError) and error.permanent and stale is None:
                raise
            store = self.stores[source]
            failure = str(error) if isinstance(error, StoreError) else (
                f"{store.url} is unreachable ({store.last_error})" if store.unreachable_since
                is not None else f"{store.url} did not answer a listing in time")
            if stale is None:
                raise ListingUnavailable(f"cannot list {prefix or '/'!r}: {failure}") from None
            # This lookup has waited for the store already: a HEAD for attributes on top
            # would take it past --store-timeout.
            self._describe_paused_until = self._clock() + _DESCRIBE_PAUSE
            if wait > 0:  # the first caller of a fetch says it; the others follow quietly
                log.warning("listing %r of %s failed (%s); serving the listing cached %.0fs "
                            "ago", prefix or "/", self.stores[source].url, failure,
                            self._clock() - stale.fetched_at)
            return stale

    def _list_ahead(self, source: str, prefix: str) -> None:
        """Starts fetching the listings of the LIST_AHEAD subdirectories that follow `prefix`
        in its parent's cached listing, those neither fresh nor being fetched; none while the
        store is unreachable."""
        if not prefix or self.stores[source].unreachable_since is not None:
            return
        parent_key = parent_prefix(prefix)
        with self._lock:
            parent = self._listings.get((source, parent_key))
            if parent is None:
                return
            siblings = parent.ordered
            position = bisect.bisect_right(siblings, prefix[len(parent_key):-1],
                                           key=lambda entry: entry.name)
            subdirectories = 0
            for entry in itertools.islice(siblings, position, position + _AHEAD_SCAN):
                if not entry.is_dir:
                    continue
                subdirectories += 1
                if subdirectories > LIST_AHEAD:
                    break
                slot = (source, f"{parent_key}{entry.name}/")
                listing = self._listings.get(slot)
                if slot in self._listing_loads or (listing is not None
                                                   and self.is_fresh(listing.fetched_at)):
                    continue
                self._listing_loads[slot] = (self._clock(),
                                             self._ahead_listers.submit(self._load_listing,
                                                                        slot, True))

    def _created_here(self, source: str, prefix: str) -> bool:
        """Whether this mount made the directory and has yet to upload its marker."""
        state = self.writeback.get(source, prefix) if self.writeback is not None else None
        return state is not None and state.kind != DELETED

    def _load_listing(self, slot: tuple[str, str], ahead: bool = False) -> _Listing:
        """Fetch and cache a listing (in a lister pool), with the uploads that settled in the
        directory while it was fetched applied over it; its fetch slot is freed however it
        ends, so the next caller after a failure asks the store again. `ahead`: fetched
        ahead of a walk (`_list_ahead`), no caller waiting yet."""
        try:
            listing = self._fetch_listing(*slot)
            listing.listed_ahead = ahead
        except BaseException:
            with self._lock:
                self._listing_loads.pop(slot, None)
                self._settled_while_loading.pop(slot, None)
            raise
        with self._lock:
            for key, info in self._settled_while_loading.pop(slot, ()):
                _settle_into(listing, key, info)
            self._listings[slot] = listing
            self._listing_loads.pop(slot, None)
        return listing

    def absence_guessed(self, parent: Node, name: str) -> bool:
        """Whether `name` reads as absent only because its directory could not be listed (the
        store unreachable, no listing ever cached) and the mount wrote nothing under it."""
        return (self._pending_child(parent, name) is False
                and (parent.source, parent.key) not in self._listings)

    def _fetch_listing(self, source: str, prefix: str) -> _Listing:
        fetched_at = self._clock()
        result = self.stores[source].list_dir(prefix)
        entries: dict[str, Entry] = {}
        skip = len(prefix)
        for sub_prefix in result.prefixes:
            name = sub_prefix[skip:-1]
            if self._acceptable(source, name, sub_prefix):
                entries[name] = Entry(name, None)
        marker = None
        for info in result.objects:
            name = info.key[skip:]
            if info.key == prefix:
                marker = info
                continue
            if name == "" or info.key.endswith("/"):
                continue  # a key that cannot be a file
            if not self._acceptable(source, name, info.key):
                continue
            if name in entries:
                self._report(info.key, f"hiding object {info.key!r}: a directory of the same "
                             "name shadows it")
                continue
            entries[name] = Entry(name, info)
        return _Listing(fetched_at, entries, marker=marker)

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

    def cached_entry(self, parent: Node, name: str) -> Entry | None | bool:
        """The child `name` if knowable without I/O (None if absent), else False.

        Pending writes are consulted first, so creating thousands of files in one directory
        never merges its listing."""
        found = self._pending_child(parent, name)
        if found is not False:
            return found
        listing = self._fresh_store_listing(parent.source, parent.key)
        return False if listing is None else listing.entries.get(name)

    def entry(self, parent: Node, name: str) -> Entry | None:
        """The child `name`, or None; lists the parent if its listing is stale (blocks).
        When the store cannot be reached and the parent was never listed, None is a guess
        (`absence_guessed` tells)."""
        found = self._pending_child(parent, name)
        if found is not False:
            return found
        try:
            return self._store_listing(parent.source, parent.key).entries.get(name)
        except ListingUnavailable as error:
            self._report(f"{parent.source}\0{parent.key}", f"{error}; names in it read as "
                         "absent until the store answers, except what this mount writes")
            return None

    def _pending_child(self, parent: Node, name: str) -> Entry | None | bool:
        if self.writeback is None or (parent.inode == ROOT_INODE and not self.single_source):
            return False
        key = parent.key + name
        marker = self.writeback.get(parent.source, key + "/")
        if marker is not None and marker.kind != DELETED:
            return Entry(name, None)
        state = self.writeback.get(parent.source, key)
        if state is not None:
            return self._pending_entry(name, state)
        if marker is not None:
            return None
        return False

    def lookup(self, parent: Node, name: str) -> Node | None:
        entry = self.entry(parent, name)
        return self.child(parent, entry) if entry else None

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
                return _richer(entry.info, node.info)
        return node.info

    def describe(self, node: Node) -> ObjectInfo | None:
        """A file's metadata with its attributes (mtime, mode, owner) read from the object,
        one HEAD the first time they are needed; kept in the node (blocks). A file gone from
        the store keeps what the listing said until its listing is fetched again. Reads of
        cached files go on while the store is down: a failed HEAD shows the listing's
        attributes, and no HEAD is tried for a while after one failed."""
        info = self.current_info(node)
        if info is None or info.attrs is not None or \
                self._clock() < self._describe_paused_until:
            return info
        try:
            found = self.stores[node.source].head_quickly(node.key)
        except StoreError as error:
            self._describe_paused_until = self._clock() + _DESCRIBE_PAUSE
            log.warning("cannot read the attributes of %s (%s); showing defaults for %.0fs",
                        node.key, error, _DESCRIBE_PAUSE)
            return info
        if found is None:
            return info
        listing = self._listings.get((node.source, parent_prefix(node.key)))
        with self._lock:
            node.info = found
            listed = listing.entries.get(node.name) if listing is not None else None
            if listed is not None and listed.info is not None and listed.info.key == node.key:
                listing.put(Entry(node.name, found))
        return found

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
        if not node.key or self.is_fresh(node.marker_read_at) or \
                self._clock() < self._describe_paused_until:
            return self.directory_info(node)
        listing = self._fresh_store_listing(node.source, node.key)
        if listing is not None and (listing.marker is None or listing.marker.attrs is not None):
            with self._lock:  # the listing shows it has none, or shows its attributes
                node.marker, node.marker_read_at = listing.marker, listing.fetched_at
            return self.directory_info(node)
        try:
            found = self.stores[node.source].head_quickly(node.key)
        except StoreError as error:
            self._describe_paused_until = self._clock() + _DESCRIBE_PAUSE
            log.warning("cannot read the attributes of %s (%s); showing defaults for %.0fs",
                        node.key, error, _DESCRIBE_PAUSE)
            return self.directory_info(node)
        with self._lock:
            node.marker, node.marker_read_at = found, self._clock()
        return self.directory_info(node)

    def subdirectories(self, node: Node) -> int | None:
        """How many subdirectories a directory has, where its listing is cached (no I/O)."""
        listing = self._listings.get((node.source, node.key))
        if listing is None:
            return None
        if self.writeback is not None and self.writeback.children(node.source, node.key):
            listing = self._with_pending(listing, node.source, node.key)
        return listing.subdirectories

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
        a remount): no store has that version, so reading it would fail."""
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
            if listing is None:
                return
            _settle_into(listing, key, info)
        self.on_changed(source, key)

    def _node_named(self, source: str, key: str) -> Node | None:
        """The node the kernel reaches by the path of `key`, if it has one (call with the lock
        held): found through the names, as nodes are indexed by their parent, not by key."""
        inode: int | None = ROOT_INODE
        for part in ([] if self.single_source else [source]) + key.rstrip("/").split("/"):
            inode = self._children.get((inode, part))
            if inode is None:
                return None
        node = self._nodes.get(inode)
        return node if node is not None and node.key == key else None

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

    # --- paths, for the control plane ------------------------------------------------------

    def refresh(self, relative: str) -> list[tuple[int, str]]:
        """Forget what is cached about `relative` and everything under it (`avafs refresh`):
        the listings of the directory, of its sub-directories and of its parent (where a new
        object at that path would appear), and the attributes of its nodes, so the next look
        asks the store. Returns the (parent inode, name) of every entry the kernel may have
        cached at or under the path, the path itself included even if it was never found,
        so the caller can have the kernel forget them too. Works on names only: no I/O."""
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        if not self.single_source and not parts:
            sources = set(self.stores)
            prefix = ""
        else:
            sources = {"" if self.single_source else parts[0]}
            inside = parts if self.single_source else parts[1:]
            prefix = "".join(f"{part}/" for part in inside)
        parent = prefix[:prefix.rstrip("/").rfind("/") + 1] if prefix else ""
        with self._lock:
            for slot in [slot for slot in self._listings if slot[0] in sources
                         and (slot[1].startswith(prefix) or slot[1] == parent)]:
                del self._listings[slot]
            entries = []
            for node in self._nodes.values():
                if node.inode != ROOT_INODE and node.source in sources and (
                        node.key.startswith(prefix) or node.key == prefix.rstrip("/")):
                    node.checked_at = -math.inf
                    entries.append((node.parent, node.name))
            inode = ROOT_INODE
            for part in parts[:-1]:
                inode = self._children.get((inode, part), 0)
            if parts and inode:
                entries.append((inode, parts[-1]))
        return entries

    def resolve(self, relative: str, listings: dict[tuple[str, str], _Listing] | None = None
                ) -> tuple[str, str, ObjectInfo | None]:
        """(source, key, info) of a file or (source, prefix, None) of a directory, by its path
        relative to the mount; raises FileNotFoundError. Creates no inodes.

        `listings` keeps the directories looked up for a batch of paths, so a batch of
        samples from one directory merges that directory's pending writes once, not once per
        path (the batched reads' largest cost)."""
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        source, prefix = "", ""
        if not self.single_source:
            if not parts:
                raise IsADirectoryError("the namespace root spans every source; name one")
            source = parts.pop(0)
            if source not in self.stores:
                raise FileNotFoundError(relative)
        for position, part in enumerate(parts):
            if listings is None:
                listing = self.listing(source, prefix)
            elif (listing := listings.get((source, prefix))) is None:
                listing = listings[(source, prefix)] = self.listing(source, prefix)
            entry = listing.entries.get(part)
            if entry is None:
                raise FileNotFoundError(relative)
            if entry.info is not None:
                if position != len(parts) - 1:
                    raise FileNotFoundError(relative)
                return source, entry.info.key, entry.info
            prefix = f"{prefix}{part}/"
        return source, prefix, None

    def files_under(self, relative: str) -> list[str]:
        """Paths, relative to the mount, of every file under a directory: what a recursive
        readdir of it through the mount finds, without a FUSE request per entry."""
        try:
            source, prefix, info = self.resolve(relative)
        except IsADirectoryError:  # the root of a mount of several sources
            return [path for source in sorted(self.stores) for path in self.files_under(source)]
        if info is not None:
            raise NotADirectoryError(relative)
        root = "" if self.single_source else f"{source}/"
        return [f"{root}{found.key}" for found in self.walk(source, prefix)]

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

    # --- directories and renames, for the writable mount -------------------------------------

    def mkdir(self, parent: Node, name: str, attrs: Attrs) -> Node:
        """A new directory with these attributes (blocks while its marker is journaled);
        Refused if the name is taken. Counts one kernel lookup of its node."""
        if self.entry(parent, name) is not None:
            raise Refused(errno.EEXIST, f"{parent.key}{name} exists")
        prefix = f"{parent.key}{name}/"
        self._check_key(parent.source, prefix)
        self.writeback.make_empty(parent.source, prefix, attrs)
        with self._lock:
            if (parent.source, parent.key) in self._listings:
                # The store's listing of the parent showed nothing of this name, so the store
                # holds nothing under it: its listing is known, empty, without asking. Files
                # written in it then show from it as they upload (`settled`), and a store
                # whose listings are slow neither hides them nor makes a readdir wait.
                self._listings[(parent.source, prefix)] = _Listing(self._clock())
        return self.child(parent, Entry(name, None))

    def make_special(self, parent: Node, name: str, attrs: Attrs) -> Node:
        """A new FIFO, socket or device node (`attrs.file_type`), as mkdir makes a directory."""
        if self.entry(parent, name) is not None:
            raise Refused(errno.EEXIST, f"{parent.key}{name} exists")
        key = parent.key + name
        self._check_key(parent.source, key)
        self.writeback.make_empty(parent.source, key, attrs)
        return self.child(parent, Entry(name, self.writeback.info(
            self.writeback.get(parent.source, key))))

    def _check_key(self, source: str, key: str) -> None:
        """Refuses a name whose key the store cannot hold, before anything is journaled."""
        if not self.stores[source].key_fits(key):
            raise Refused(errno.ENAMETOOLONG, f"{key!r} is too long for "
                          f"{self.stores[source].url}")

    def check_key(self, parent: Node, name: str) -> None:
        """`_check_key` for a file about to be created as `name` in `parent`."""
        self._check_key(parent.source, parent.key + name)

    def rmdir(self, parent: Node, name: str) -> None:
        """Remove an empty directory (blocks while it is listed and journaled)."""
        entry = self.entry(parent, name)
        if entry is None:
            raise Refused(errno.ENOENT, f"{parent.key}{name} does not exist")
        if not entry.is_dir:
            raise Refused(errno.ENOTDIR, f"{parent.key}{name} is a file")
        prefix = f"{parent.key}{name}/"
        if self.listing(parent.source, prefix).entries:
            raise Refused(errno.ENOTEMPTY, f"{prefix} is not empty")
        self.writeback.rmdir(parent.source, prefix)

    def plan_rename(self, old_parent: Node, old_name: str, new_parent: Node, new_name: str,
                    replace: bool) -> RenamePlan:
        """Check a rename within one source as POSIX does (Refused with its errno) and plan it;
        lists a renamed directory's whole subtree (blocks). `replace`: an existing target may
        be replaced (no RENAME_NOREPLACE)."""
        entry = self.entry(old_parent, old_name)
        if entry is None:
            raise Refused(errno.ENOENT, f"{old_parent.key}{old_name} does not exist")
        target = self.entry(new_parent, new_name)
        if target is not None and not replace:
            raise Refused(errno.EEXIST, f"{new_parent.key}{new_name} exists")
        source = old_parent.source
        self._check_key(new_parent.source, new_parent.key + new_name + ("/" if entry.is_dir
                                                                          else ""))
        if entry.is_dir:
            old_key, new_key = f"{old_parent.key}{old_name}/", f"{new_parent.key}{new_name}/"
            if new_key.startswith(old_key):
                raise Refused(errno.EINVAL, f"cannot move {old_key} into itself")
            if target is not None and not target.is_dir:
                raise Refused(errno.ENOTDIR, f"{new_key} is a file")
            if target is not None and self.listing(source, new_key).entries:
                raise Refused(errno.ENOTEMPTY, f"{new_key} is not empty")
            moves, markers = self._directory_moves(source, old_key, new_key)
            for _, moved, _ in moves:
                self._check_key(source, moved)
        else:
            old_key, new_key = old_parent.key + old_name, new_parent.key + new_name
            if target is not None and target.is_dir:
                raise Refused(errno.EISDIR, f"{new_key} is a directory")
            moves, markers = [(old_key, new_key, entry)], []
        return RenamePlan(source, old_parent, old_name, new_parent, new_name, old_key, new_key,
                          entry.is_dir, moves, markers, self.node_of(old_parent, old_name),
                          self.node_of(new_parent, new_name) if target is not None else None)

    def _directory_moves(self, source: str, old_prefix: str, new_prefix: str
                         ) -> tuple[list[tuple[str, str, Entry]], list[tuple[str, str]]]:
        """Every file and directory under `old_prefix`, as listed now, with its new key; the
        listings are kept under their new prefixes (`_prepare_move`)."""
        moves, markers = [], [(old_prefix, new_prefix)]
        pending_dirs, listings = [old_prefix], {}
        while pending_dirs:
            prefix = pending_dirs.pop()
            listings[prefix] = self.listing(source, prefix)
            for entry in listings[prefix].ordered:
                if entry.is_dir:
                    sub = f"{prefix}{entry.name}/"
                    markers.append((sub, new_prefix + sub[len(old_prefix):]))
                    pending_dirs.append(sub)
                else:
                    key = prefix + entry.name
                    moves.append((key, new_prefix + key[len(old_prefix):], entry))
        self._prepare_move(source, listings, old_prefix, new_prefix)
        return moves, markers

    def rename(self, plan: RenamePlan) -> None:
        """Make a planned rename: write-back journals it as one batch (blocks until it is
        durable), then the nodes answer for their new keys and the replaced one for none. A
        moved file with no pending state is clean; its info is looked up as the rename is
        applied (an upload settling after the file was listed makes it clean, with the info
        the listing has now)."""
        source = plan.source
        listed = {old: entry.info for old, _, entry in plan.moves}

        def clean_info(key: str) -> ObjectInfo | None:
            if key.endswith("/"):
                return self.marker_info(source, key)
            return self.listed_info(source, key) or listed[key]

        self.writeback.rename(source, [(old, new) for old, new, _ in plan.moves], plan.markers,
                              clean_info, plan.old_key)
        if plan.replaced is not None:
            self.detach(plan.replaced)
        node = self.node_of(plan.old_parent, plan.old_name)
        if node is not None:
            self._moved(node, plan.new_parent, plan.new_name, plan.new_key)

    def _prepare_move(self, source: str, listings: dict[str, _Listing], old_prefix: str,
                      new_prefix: str) -> None:
        """Before a directory rename is journaled: the listings of its directories (as the
        mount shows them, keyed by prefix) under their new prefixes, so an upload settling
        there (possibly before the rename returns) updates what its files show. With no
        listing, a file written there showed its size from before the rename."""
        with self._lock:
            for prefix, listing in listings.items():
                moved = new_prefix + prefix[len(old_prefix):]
                self._listings[(source, moved)] = _Listing(listing.fetched_at, {
                    name: Entry(name, entry.info and dataclasses.replace(entry.info,
                                                                         key=moved + name))
                    for name, entry in listing.entries.items()})

    def _moved(self, node: Node, new_parent: Node, new_name: str, new_key: str) -> None:
        """The kernel keeps a renamed inode, so the node (and, for a directory, every node
        below it) must answer for its new key from now on."""
        with self._lock:
            self._children.pop((node.parent, node.name), None)
            stale = self._children.get((new_parent.inode, new_name))
            if stale is not None and stale != node.inode:
                del self._children[(new_parent.inode, new_name)]
            old_key = node.key
            node.parent, node.name, node.key = new_parent.inode, new_name, new_key
            self._children[(new_parent.inode, new_name)] = node.inode
            if node.is_dir:
                for other in self._nodes.values():
                    if other is not node and other.source == node.source and \
                            other.key.startswith(old_key):
                        other.key = new_key + other.key[len(old_key):]
