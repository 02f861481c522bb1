"""Directories are key prefixes ('/' delimiter), with or without marker objects. Listings are the
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

A part of Namespace (__init__.py): the listing cache, its fetches and the list-ahead, guarded
by Namespace's `_lock`.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from concurrent.futures import TimeoutError as WaitTimeout
from dataclasses import dataclass, field

from ..errors import StoreError
from ..objects import parent_prefix
from ..stores.base import ObjectInfo
from ..writeback.pending import DELETED, Pending
from .nodes import ROOT_INODE, Entry, Node, valid_name

log = logging.getLogger(__name__)

DESCRIBE_PAUSE = 10.0
"""Seconds no file's attributes are read from the store after a read of them failed, or a
listing did not come in time and its cached one was served."""
LISTERS = 8
"""Listings fetched at once; more wait in the pool's queue, their callers bounded as ever."""
STALE_WAIT = 1.0
"""Seconds a lookup waits for a fresh listing before it uses the stale one."""
LIST_AHEAD = 8
"""Subdirectories listed ahead of a walk (module docstring), and the threads that list them."""
_AHEAD_SCAN = 64
"""Entries after a directory in its parent's listing looked through for the subdirectories
to list ahead: files between them are skipped, up to this many."""


class ListingUnavailable(StoreError):
    """A directory's listing could not be had from a store that does not answer, and none is
    cached (transient: a later lookup asks again)."""


@dataclass(slots=True, weakref_slot=True)
class CachedListing:
    fetched_at: float
    entries: dict[str, Entry] = field(default_factory=dict)
    _ordered: list[Entry] | None = None
    _directories: set[str] | None = None
    """The subdirectories' names, found once, then kept up to date by `put` and `drop`
    (an upload settling puts its entry: a recount per settle would scan the directory)."""
    listed_ahead: bool = False
    """Fetched ahead of a walk and not asked for since: its first caller moves the window."""
    marker: ObjectInfo | None = None
    """The directory's own marker object as the listing showed it; None: it has none."""

    @property
    def subdirectories(self) -> int:
        return len(self.directory_names)

    @property
    def directory_names(self) -> set[str]:
        """The subdirectories' names (the caller must not change the set)."""
        if self._directories is None:
            self._directories = {name for name, entry in self.entries.items() if entry.is_dir}
        return self._directories

    @property
    def ordered(self) -> list[Entry]:
        """Entries by name; sorted on demand so single-entry updates stay O(1)."""
        if self._ordered is None:
            self._ordered = sorted(self.entries.values(), key=lambda entry: entry.name)
        return self._ordered

    def put(self, entry: Entry) -> None:
        self.entries[entry.name] = entry
        self._ordered = None
        if self._directories is not None:
            if entry.is_dir:
                self._directories.add(entry.name)
            else:
                self._directories.discard(entry.name)

    def drop(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self._ordered = None
            if self._directories is not None:
                self._directories.discard(name)


def settle_into(listing: CachedListing, key: str, info: ObjectInfo | None) -> None:
    """Show in a directory's listing what the store now has for `key` (None: deleted)."""
    name = key[len(parent_prefix(key)):].rstrip("/")
    if info is not None:
        listing.put(Entry(name, None if key.endswith("/") else info))
    else:  # a removed directory marker settles after everything that was under it
        current = listing.entries.get(name)
        if current is not None and current.is_dir == key.endswith("/"):
            listing.drop(name)


class ListingCache:
    def _fresh_store_listing(self, source: str, prefix: str) -> CachedListing | None:
        listing = self._listings.get((source, prefix))
        if listing is not None and self.is_fresh(listing.fetched_at):
            return listing
        return None

    def listed_directory(self, source: str, prefix: str) -> CachedListing | None:
        """The store's listing of a directory as cached, without what this mount has pending
        in it, if it is fresh; else None. The same object until the directory is listed
        again (the read-ahead of its files keeps its sorted names that long)."""
        return self._fresh_store_listing(source, prefix)

    def cached_listing(self, source: str, prefix: str) -> CachedListing | None:
        """The directory as the mount shows it, if that needs no I/O, else None."""
        listing = self._fresh_store_listing(source, prefix)
        return None if listing is None else self._with_pending(listing, source, prefix)

    def listing(self, source: str, prefix: str) -> CachedListing:
        """The directory as the mount shows it: the store's listing under pending writes. A
        directory this mount created while the store was unreachable lists what was written
        in it; any other that cannot be listed raises."""
        try:
            listing = self._store_listing(source, prefix)
        except ListingUnavailable:
            if not self._created_here(source, prefix):
                raise
            listing = CachedListing(self._clock())
        return self._with_pending(listing, source, prefix)

    def _with_pending(self, listing: CachedListing, source: str, prefix: str) -> CachedListing:
        pending = self.writeback.children(source, prefix) if self.writeback else ()
        if not pending:
            return listing
        merged = CachedListing(listing.fetched_at, dict(listing.entries))
        for state in pending:
            name = state.key[len(prefix):].rstrip("/")
            visible = self._pending_entry(name, state)
            if visible is not None:
                merged.put(visible)
            elif state.key.endswith("/") == (merged.entries.get(name, Entry(name, None)).is_dir):
                merged.drop(name)
        return merged

    def _subdirectories_with_pending(self, listing: CachedListing, source: str,
                                     prefix: str) -> int:
        """`_with_pending(listing, source, prefix).subdirectories`, reading only the pending
        states that can change it: directory markers, and files named as a subdirectory
        (a file's state shadows it, as the merge puts it in the directory's place). Why: the
        kernel asks for a directory's attributes after each entry made in it, and a merge of
        every pending file per ask made writing many files into one directory quadratic."""
        directories = set(listing.directory_names)
        for state in self.writeback.child_markers(source, prefix):
            name = state.key[len(prefix):-1]
            if state.kind == DELETED:
                directories.discard(name)
            else:
                directories.add(name)
        return sum(1 for name in directories
                   if (state := self.writeback.get(source, prefix + name)) is None
                   or state.kind == DELETED)

    def _pending_entry(self, name: str, state: Pending) -> Entry | None:
        if state.kind == DELETED:
            return None
        if state.key.endswith("/"):
            return Entry(name, None)
        return Entry(name, self.writeback.info(state))

    def _store_listing(self, source: str, prefix: str) -> CachedListing:
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
            self._describe_paused_until = self._clock() + DESCRIBE_PAUSE
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

    def _load_listing(self, slot: tuple[str, str], ahead: bool = False) -> CachedListing:
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
                settle_into(listing, key, info)
            self._listings[slot] = listing
            self._listing_loads.pop(slot, None)
        return listing

    def absence_guessed(self, parent: Node, name: str) -> bool:
        """Whether `name` reads as absent only because its directory could not be listed (the
        store unreachable, no listing ever cached) and the mount wrote nothing under it."""
        return (self._pending_child(parent, name) is False
                and (parent.source, parent.key) not in self._listings)

    def _fetch_listing(self, source: str, prefix: str) -> CachedListing:
        fetched_at = self._clock()
        store = self.stores[source]
        result = store.list_dir(prefix)
        objects = result.objects if self.known is None else \
            self.known.recall(store.url, result.objects)
        entries: dict[str, Entry] = {}
        skip = len(prefix)
        for sub_prefix in result.prefixes:
            name = sub_prefix[skip:-1]
            if self._acceptable(source, name, sub_prefix):
                entries[name] = Entry(name, None)
        marker = None
        for info in objects:
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
        return CachedListing(fetched_at, entries, marker=marker)

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
