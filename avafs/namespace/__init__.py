"""Path -> (source, key): the inode table and the listing cache, and the namespace changes of a
writable mount (mkdir, rmdir, rename) checked as POSIX has them and planned here, so the FUSE
operations only translate requests and answers.

The package is the `Namespace`: its state is set up here and its methods live in rooms, one
idea each: the inode table (nodes.py), the listing cache with list-ahead and staleness
(listings.py), what a file or directory is now (metadata.py), namespace changes and rename
planning (changes.py), and paths for the control plane (paths.py). Attributes read on an
earlier mount of the same cache dir are known_attributes.py's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from ..stores.base import ObjectInfo, ObjectStore
from ..writeback.manager import WriteBack
from .changes import Changes, RenamePlan
from .known_attributes import KnownAttributes
from .listings import LIST_AHEAD, LISTERS, CachedListing, ListingCache, ListingUnavailable
from .metadata import Metadata
from .nodes import NAME_MAX, ROOT_INODE, Entry, InodeTable, Node, Refused, valid_name
from .paths import PathLookups

__all__ = ["LIST_AHEAD", "NAME_MAX", "ROOT_INODE", "Entry", "ListingUnavailable", "Namespace",
           "Node", "Refused", "RenamePlan", "valid_name"]


class Namespace(InodeTable, ListingCache, Metadata, Changes, PathLookups):
    def __init__(self, stores: dict[str, ObjectStore], ttl: float,
                 writeback: WriteBack | None = None, store_wait: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 known: KnownAttributes | None = None) -> None:
        """`known`: attributes read on earlier mounts (known_attributes.py); None for a mount
        that reads none (`--listing-attrs`)."""
        self.stores = stores
        self.writeback = writeback
        self.known = known
        self.ttl = ttl
        self.store_wait = store_wait
        self._clock = clock
        self._listers = ThreadPoolExecutor(LISTERS, thread_name_prefix="avafs-list")
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
        self._listings: dict[tuple[str, str], CachedListing] = {}
        self._listing_loads: dict[tuple[str, str], tuple[float, Future[CachedListing]]] = {}
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
            self._listings[("", "")] = CachedListing(math.inf, {name: Entry(name, None)
                                                           for name in stores})

    def is_fresh(self, checked_at: float) -> bool:
        return self._clock() - checked_at < self.ttl

    def fresh_for(self, listings: Iterable[CachedListing]) -> float:
        """Seconds until the oldest of these listings is fetched again (inf: never)."""
        return min(listing.fetched_at for listing in listings) + self.ttl - self._clock()
