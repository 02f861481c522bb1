"""Small files of a directory read in name order are fetched ahead of their readers.

Why: a small file's first lookup costs one GET (the one that reads its attributes and brings
its bytes, `TierStack.fetch_described`), and readers that walk a directory in order (a copy,
an archiver, one reader's unshuffled pass over a dataset) have only as many of those GETs in
flight as they have threads. Each GET then pays its round trip alone, and a store serves GETs
that come a few at a time at a higher cost per GET than a steady stream of them. A lookup
that follows the lookups before it in the directory's listing order starts the GETs of the
next files too, as the kernel reads a file's next pages ahead of a reader that reads it in
order.

What counts as in order (`_Run`): lookups of files of one directory whose positions in its
listing each fall within `JITTER` of the furthest one so far, and that cover at most twice as
many positions as there were lookups: several readers taking the files in turn look up a few of
them out of order, a shuffled reader's lookups scatter over the directory. After `TRIGGER` such
lookups the next `WINDOW` files are fetched, and each lookup further on moves the window. A
lookup elsewhere in the directory starts a new run. Each reader (the thread or process that
sends the lookup, as the kernel names it) also has a run of its own in each directory, so that
readers each walking a different part of one directory, as a `DataLoader`'s workers without
shuffling do, are followed each in its part: their lookups break the directory's run, not their
own. Not several runs per directory whoever looks up: that took shuffled readers for readers in
order (docs/optimization-history.md). Only files of one small block that
no tier holds or loads are fetched (at the defaults, only those whose attributes are not read
yet), each as its own lookup would have fetched it, under a fetch slot that a reader's own read
does not need: when none is free the file is left for its reader. A lookup of a file being
fetched ahead waits for that GET instead of sending its own; a READ, for the block's load.

With `--listing-attrs` a lookup sends no request (so `ls -l` or `find` fetches nothing), and
what is followed is each file's first READ instead, the GET of its bytes alone fetched ahead.

Everything here runs on the FUSE loop: no lock. A directory's names are sorted once per listing
(`sorted` of a store's listing, which comes in key order, is one pass) and kept while that
listing is the cached one (a run refers to it weakly); only the last DIRECTORIES directories
looked up in are followed.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import Counter

from ..errors import AvafsError
from ..namespace import Namespace, Node
from ..namespace.listings import CachedListing
from ..objects import ObjectRef, parent_prefix
from ..stores.base import ObjectInfo
from ..tiers.stack import TierStack

log = logging.getLogger(__name__)

TRIGGER = 6
"""Lookups in order before files are fetched ahead."""
WINDOW = 32
"""Files fetched ahead of the furthest lookup of a run."""
JITTER = 16
"""How far behind or ahead of the furthest lookup so far a lookup may be and still be in order:
about the readers that may take a directory's files in turn."""
DIRECTORIES = 64
"""Directories whose lookups are followed at once."""
READERS = 16
"""Readers whose own runs each directory keeps: the last ones to look up in it."""


@dataclass(slots=True)
class _Run:
    """The lookups (with `--listing-attrs`, first reads) in order in one directory, and how
    far ahead its files are fetched."""

    listing: weakref.ReferenceType[CachedListing]
    """The listing whose names these are: a run does not keep one alive."""
    names: list[str]
    first: int = -1
    furthest: int = -1
    lookups: int = 0
    fetched_to: int = 0
    """Positions before this were fetched ahead (or left to their readers) already."""
    seen: set[int] = field(default_factory=set)
    """Positions looked up in this run, those JITTER or less behind the furthest at least."""
    readers: OrderedDict[int, _Run] | None = None
    """A directory's run only: the runs of the last READERS readers in it, over its names,
    which go with it when the directory is listed again."""

    def reader(self, reader: int) -> _Run:
        """`reader`'s own run in this directory."""
        if self.readers is None:
            self.readers = OrderedDict()
        run = self.readers.get(reader)
        if run is None:
            run = self.readers[reader] = _Run(self.listing, self.names)
            if len(self.readers) > READERS:
                self.readers.popitem(last=False)
        else:
            self.readers.move_to_end(reader)
        return run

    def note(self, position: int) -> bool:
        """Counts a lookup at `position`; whether the run is in order and long enough to
        fetch ahead of. A position looked up again (a lookup and a getattr) counts once, and
        one of the run further behind its furthest than JITTER not at all."""
        behind = self.lookups and self.first <= position < self.furthest - JITTER
        if not behind and position not in self.seen:
            if self.lookups and abs(position - self.furthest) <= JITTER:
                self.lookups += 1
                self.first = min(self.first, position)
                self.furthest = max(self.furthest, position)
            else:
                self.lookups, self.first, self.furthest = 1, position, position
                self.fetched_to = position + 1
                self.seen.clear()
            self.seen.add(position)
            if len(self.seen) > 2 * WINDOW:
                self.seen = {seen for seen in self.seen if seen >= self.furthest - JITTER}
        return self.lookups >= TRIGGER and self.furthest - self.first < 2 * self.lookups


class DirectoryReadAhead:
    """Fetches the files ahead of lookups, or first reads, in order (module docstring).
    Called on the FUSE loop only."""

    def __init__(self, namespace: Namespace, stack: TierStack, fetched: Counter,
                 describe: bool) -> None:
        """`fetched` counts the files fetched ahead (`Metrics.read_ahead_files`). `describe`:
        the files' attributes are read with their bytes, and lookups are what is followed
        (the defaults); else (`--listing-attrs`) their bytes alone, and first reads."""
        self.namespace = namespace
        self.stack = stack
        self._fetched = fetched
        self._describe = describe
        self._enabled = stack.cluster is None
        """A mount with a cluster tier reads blocks in threads (its lookups' GETs too)."""
        self._runs: OrderedDict[tuple[str, str], _Run] = OrderedDict()
        self._fetching: dict[tuple[str, str], asyncio.Task[None]] = {}

    def reached(self, node: Node, reader: int | None = None) -> None:
        """A file's lookup, or with `--listing-attrs` its first read (a lookup then sends
        no request, and a walk that only stats files must not fetch them): follows its
        directory's run, and `reader`'s own run there where the caller names one (the
        lookup's thread or process), starting the fetches ahead of whichever is in order."""
        if not self._enabled:
            return
        prefix = parent_prefix(node.key)
        listing = self.namespace.listed_directory(node.source, prefix)
        if listing is None:
            return
        run = self._run(node.source, prefix, listing)
        position = bisect.bisect_left(run.names, node.name)
        if position == len(run.names) or run.names[position] != node.name:
            return
        in_order = run.note(position)
        if in_order:
            self._fetch_ahead(node.source, run, listing)
        if reader is not None:
            own = run.reader(reader)
            if own.note(position) and not in_order:
                self._fetch_ahead(node.source, own, listing)

    def fetching(self, source: str, key: str) -> asyncio.Task[None] | None:
        """The fetch ahead of this file under way, whose answer its lookup may wait for."""
        return self._fetching.get((source, key))

    def _run(self, source: str, prefix: str, listing: CachedListing) -> _Run:
        slot = (source, prefix)
        run = self._runs.get(slot)
        if run is None or run.listing() is not listing:
            for gone in [key for key, other in self._runs.items() if other.listing() is None]:
                del self._runs[gone]  # listed again since: their names are no longer current
            run = self._runs[slot] = _Run(weakref.ref(listing), sorted(listing.entries))
        self._runs.move_to_end(slot)
        while len(self._runs) > DIRECTORIES:
            self._runs.popitem(last=False)
        return run

    def _fetch_ahead(self, source: str, run: _Run, listing: CachedListing) -> None:
        """Starts the fetches of the run's next files, up to WINDOW past its furthest lookup
        and WINDOW fetches under way in all: the fetch slots beyond them stay free for the
        readers' own GETs."""
        position = max(run.fetched_to, run.furthest + 1)
        end = min(run.furthest + 1 + WINDOW, len(run.names))
        while position < end and len(self._fetching) < WINDOW:
            entry = listing.entries.get(run.names[position])
            listed = None if entry is None else entry.info
            if listed is not None and listed.size > 0 and \
                    (listed.attrs is None or not self._describe) and \
                    (source, listed.key) not in self._fetching:
                ref = self.namespace.object_ref(source, listed)
                if self.stack.absent_small(ref):
                    self._fetching[(source, listed.key)] = asyncio.get_running_loop() \
                        .create_task(self._fetch(source, listed, ref))
            position += 1
        run.fetched_to = max(run.fetched_to, position)

    async def _fetch(self, source: str, listed: ObjectInfo, ref: ObjectRef) -> None:
        """Loads the file with one GET from this loop where it can be sent now (a free fetch
        slot, the block neither cached nor loading), reading its attributes with it where
        `describe`: its lookup then finds them in the directory's listing (`learned`). A GET
        not sent or failed leaves the file to its reader, as if nothing was fetched ahead."""
        try:
            if not self._describe:
                if await self.stack.fetch_ahead(ref):
                    self._fetched.inc()
                return
            if self.namespace.describe_paused():
                return
            found = await self.stack.fetch_described(listed, ref)
            if found is not None:
                self.namespace.learned(source, listed, found)
                self._fetched.inc()
        except AvafsError as error:
            log.debug("fetching %s ahead: %s", listed.key, error)
        except Exception:  # noqa: BLE001 - best effort: its reader reads it as before
            log.exception("fetching %s ahead failed", listed.key)
        finally:
            self._fetching.pop((source, listed.key), None)
