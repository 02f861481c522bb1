"""FUSE operations: translate kernel requests to namespace and tier calls, and nothing else.

Anything that may block (a LIST, a HEAD, a block load) runs in a worker thread; answers that are
already in memory (fresh listings, RAM-resident blocks) are given inline, because a thread hop
costs more than the answer. The kernel's own caches are used on purpose: entry and attribute
timeouts follow `--metadata-ttl`, negative lookups are cached as well, and `keep_cache` is set
when a file is reopened at an unchanged ETag, so warm re-reads come from the page cache.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pyfuse3
import trio

from .errors import ObjectChangedError, StoreError
from .namespace import ROOT_INODE, Entry, Namespace, Node
from .options import MountOptions
from .tiers.blocks import block_span
from .tiers.stack import ObjectRef, TierStack

log = logging.getLogger(__name__)

T = TypeVar("T")
_KERNEL_TIMEOUT_CAP = 365 * 86400.0
_XATTR_PREFIX = b"user.avafs."
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


@dataclass(slots=True)
class OpenFile:
    ref: ObjectRef
    next_block: int = 0
    """Block a sequential reader will ask for next; a read that starts there is sequential."""


@dataclass(slots=True)
class OpenDirectory:
    node: Node
    entries: list[Entry] | None = None
    """The listing this handle pages through, fixed at its first readdir for consistency."""


class AvafsOperations(pyfuse3.Operations):
    def __init__(self, namespace: Namespace, stack: TierStack, options: MountOptions,
                 xattrs: dict[str, str]) -> None:
        super().__init__()
        self.namespace = namespace
        self.stack = stack
        self.options = options
        self.xattrs = {_XATTR_PREFIX + name.encode(): value.encode()
                       for name, value in xattrs.items()}
        self._open: dict[int, OpenFile] = {}
        self._dirs: dict[int, OpenDirectory] = {}
        self._next_fh = 0
        self._limiter = trio.CapacityLimiter(64)
        self._timeout = min(options.effective_metadata_ttl, _KERNEL_TIMEOUT_CAP)
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._started_ns = time.time_ns()

    def _new_fh(self) -> int:
        self._next_fh += 1
        return self._next_fh

    async def _blocking(self, function: Callable[..., T], *args: object) -> T:
        try:
            return await trio.to_thread.run_sync(function, *args, limiter=self._limiter)
        except ObjectChangedError as error:
            log.warning("%s", error)
            raise pyfuse3.FUSEError(errno.ESTALE) from None
        except StoreError as error:
            log.error("%s", error)
            raise pyfuse3.FUSEError(errno.EIO) from None

    # --- attributes ------------------------------------------------------------------------

    def _attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = node.inode
        attrs.generation = 0
        attrs.entry_timeout = self._timeout
        attrs.attr_timeout = self._timeout
        attrs.st_uid = self._uid
        attrs.st_gid = self._gid
        attrs.st_blksize = 128 * 1024
        if node.info is None:
            attrs.st_mode = stat.S_IFDIR | 0o755
            attrs.st_nlink = 1
            attrs.st_size = 0
            mtime_ns = self._started_ns
        else:
            attrs.st_mode = stat.S_IFREG | 0o644
            attrs.st_nlink = 1
            attrs.st_size = node.info.size
            mtime_ns = int(node.info.mtime * 1e9)
        attrs.st_blocks = -(-attrs.st_size // 512)
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = mtime_ns
        return attrs

    def _negative_entry(self) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = 0
        attrs.entry_timeout = self._timeout
        return attrs

    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent = self.namespace.node(parent_inode)
        text = os.fsdecode(name)
        if text == ".":
            return self._attributes(parent)
        if text == "..":
            return self._attributes(self.namespace.node(parent.parent))
        listing = self.namespace.cached_listing(parent.source, parent.key)
        if listing is not None:
            entry = listing.entries.get(text)
            node = self.namespace.child(parent, entry) if entry else None
        else:
            node = await self._blocking(self.namespace.lookup, parent, text)
        if node is None:
            return self._negative_entry()
        return self._attributes(node)

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:
        return self._attributes(self.namespace.node(inode))

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.namespace.forget(inode, count)

    async def statfs(self, ctx=None) -> pyfuse3.StatvfsData:
        disk = self.stack.disk
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = disk.capacity // 4096
        data.f_bfree = data.f_bavail = max(0, disk.capacity - disk.used) // 4096
        data.f_files = self.options.disk_cache_files
        data.f_ffree = data.f_favail = max(0, self.options.disk_cache_files - len(disk))
        data.f_namemax = 255
        return data

    async def getxattr(self, inode: int, name: bytes, ctx=None) -> bytes:
        if inode == ROOT_INODE and name in self.xattrs:
            return self.xattrs[name]
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode: int, ctx=None) -> list[bytes]:
        return list(self.xattrs) if inode == ROOT_INODE else []

    # --- directories -------------------------------------------------------------------------

    async def opendir(self, inode: int, ctx=None) -> int:
        directory = self.namespace.node(inode)
        if not directory.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = self._new_fh()
        self._dirs[fh] = OpenDirectory(directory)
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        handle = self._dirs[fh]
        directory = handle.node
        if handle.entries is None or start_id == 0:
            listing = self.namespace.cached_listing(directory.source, directory.key)
            if listing is None:
                listing = await self._blocking(self.namespace.listing, directory.source,
                                               directory.key)
            handle.entries = listing.ordered
        for position in range(start_id, len(handle.entries)):
            entry = handle.entries[position]
            node = self.namespace.child(directory, entry)
            if not pyfuse3.readdir_reply(token, os.fsencode(entry.name), self._attributes(node),
                                         position + 1):
                self.namespace.forget(node.inode, 1)
                break

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # --- files ---------------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx=None) -> pyfuse3.FileInfo:
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.namespace.node(inode)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        info = node.info
        if not self.namespace.is_fresh(node.checked_at):
            info = await self._blocking(self.namespace.revalidate, node)
            if info is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
        keep_cache = node.kernel_cached_etag == info.etag
        node.kernel_cached_etag = info.etag
        fh = self._new_fh()
        self._open[fh] = OpenFile(self.namespace.object_ref(node.source, info))
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._open[fh]
        ref = handle.ref
        data = self.stack.read_from_ram(ref, off, size)
        if data is None:
            data = await self._blocking(self.stack.read, ref, off, size)
        self._read_ahead(handle, off, size)
        return data

    def _read_ahead(self, handle: OpenFile, off: int, size: int) -> None:
        span = block_span(off, size, handle.ref.size, self.stack.block_size)
        if not span:
            return
        sequential = span.start in (handle.next_block - 1, handle.next_block)
        if sequential and span.stop > handle.next_block and self.options.read_ahead:
            self.stack.prefetch(handle.ref, span.stop, self.options.read_ahead)
        handle.next_block = span.stop

    async def release(self, fh: int) -> None:
        self._open.pop(fh, None)

    async def flush(self, fh: int) -> None:
        return None

    # --- writes: refused until the write-back path lands ----------------------------------------

    async def _read_only(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _read_only
    create = write = setxattr = removexattr = _read_only
