"""Directory requests: opening and reading directories, mkdir and rmdir; a part of
AvafsOperations (operations.py), whose `_dirs` (open directories) and `_kernel_listings`
(what the kernel keeps of each directory read to its end) these methods keep."""

from __future__ import annotations

import errno
import os
import stat

import pyfuse3

from ..namespace import Entry, Node
from .handles import OpenDirectory
from .kernel import CACHES_DIRECTORIES


class DirectoryRequests:
    async def opendir(self, inode: int, ctx=None) -> int | pyfuse3.FileInfo:
        """Where pyfuse3 allows it, every directory is opened with the kernel's readdir cache
        on: a directory read to its end is read again from the kernel's page cache, with no
        request, for as long as each open finds it unchanged. What the kernel caches are the
        names and inode numbers of the entries; attributes keep their own timeouts. Unchanged
        means: the listing is fresh (within the metadata TTL, so this open does no I/O) and
        names the same entries, with the same inodes, as when the kernel read it. Otherwise
        the open drops the kernel's copy, and the next read asks the daemon (which lists
        again when the listing is stale). Changes made through this mount need no check: the
        kernel drops its copy itself when it creates, removes or renames an entry, and so
        does `avafs refresh` through its invalidations."""
        directory = self.namespace.node(inode)
        if not directory.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = self._new_fh()
        self._dirs[fh] = OpenDirectory(directory)
        if not CACHES_DIRECTORIES:
            return fh
        held = self._kernel_listings.get(inode)
        listing = None if held is None else \
            self.namespace.cached_listing(directory.source, directory.key)
        unchanged = listing is not None and held == self._listed(directory, listing.ordered)
        return pyfuse3.FileInfo(fh=fh, keep_cache=unchanged, cache_readdir=True)

    def _listed(self, directory: Node, entries: list[Entry]) -> int:
        """What the kernel keeps of a directory read to its end: each entry's name and inode
        (0 for an entry it has forgotten, whose next lookup makes a new inode)."""
        node_of = self.namespace.node_of
        return hash(tuple((entry.name, node.inode if (node := node_of(directory, entry.name))
                           else 0) for entry in entries))

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        handle = self._dirs[fh]
        directory = handle.node
        if handle.entries is None or start_id == 0:
            listing = self.namespace.cached_listing(directory.source, directory.key)
            if listing is None:
                listing = await self._blocking(self.namespace.listing, directory.source,
                                               directory.key)
            handle.entries = listing.ordered
        if start_id >= len(handle.entries):
            if CACHES_DIRECTORIES:  # the empty answer that ends the kernel's read of them all
                self._kernel_listings[directory.inode] = self._listed(directory, handle.entries)
            return
        child, attributes, reply = self.namespace.child, self._attributes, pyfuse3.readdir_reply
        for position in range(start_id, len(handle.entries)):
            entry = handle.entries[position]
            node = child(directory, entry)
            if not reply(token, os.fsencode(entry.name), attributes(node, directory.key),
                         position + 1):
                self._forget(node.inode, 1)
                break

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx=None) -> pyfuse3.EntryAttributes:
        parent = self.namespace.node(parent_inode)
        self._check_writable_directory(parent)
        self._check_name(name)
        node = await self._blocking(self.namespace.mkdir, parent, os.fsdecode(name),
                                    self._creator_attrs(parent, stat.S_IFDIR | mode, ctx))
        self.namespace.entries_changed(parent)
        return self._attributes(node)

    async def rmdir(self, parent_inode: int, name: bytes, ctx=None) -> None:
        parent = self.namespace.node(parent_inode)
        self._check_writable_directory(parent)
        await self._blocking(self.namespace.rmdir, parent, os.fsdecode(name))
        self.namespace.entries_changed(parent)
