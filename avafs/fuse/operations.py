"""The FUSE request handlers: translate kernel requests to namespace, tier and write-back calls,
and nothing else.

`AvafsOperations` is one object, as pyfuse3 calls one; its handlers are grouped by what they
do, a room each: attributes (attributes.py), directories (directories.py), writes and changes
of attributes (writes.py), unlink and rename (changes.py), links and special files (links.py).
This module holds the state they share (set up in `__init__`), the lookups, and the reads.

Anything that may block (a LIST, a HEAD) runs in a worker thread; answers that are already in
memory (fresh listings) are given inline, because a thread hop costs more than the answer.
Reads of clean data go to `TierStack.read_async`, which makes the same choice for blocks and
keeps each open file's read-ahead; the handlers share one pool of worker threads with it
(`_threads`). The kernel's own caches are used on purpose: entry and attribute timeouts follow
`--metadata-ttl`, negative lookups are cached as well, and `keep_cache` is set when a file is
reopened at an unchanged ETag, so warm re-reads come from the page cache. Not the kernel's
write-back cache (`enable_writeback_cache`): with it the kernel trusts its own size and mtime
of a cached file over the daemon's, so an object replaced in the store would keep its old
length.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyfuse3

from ..config.options import MountOptions
from ..namespace import NAME_MAX, ROOT_INODE, Namespace, Node, valid_name
from ..objects import ObjectRef
from ..stores.base import ObjectInfo
from ..tiers.block_file_reads import BlockFileRange
from ..tiers.stack import Piece, TierStack
from ..writeback.pending import DATA, Pending
from .attributes import AttributeAnswers
from .changes import NamespaceChanges
from .directories import DirectoryRequests
from .errors import as_fuse_error, guarded
from .handles import OpenDirectory, OpenFile
from .kernel import FILE_RANGES, READER, READS_NAME_INODE, drop_pages
from .links import LinkRequests
from .read_ahead import DirectoryReadAhead
from .writes import WriteRequests

T = TypeVar("T")
_KERNEL_TIMEOUT_CAP = 365 * 86400.0
_XATTR_PREFIX = b"user.avafs."
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


@guarded
class AvafsOperations(AttributeAnswers, DirectoryRequests, WriteRequests, NamespaceChanges,
                      LinkRequests, pyfuse3.Operations):
    enable_splice_write = FILE_RANGES
    """READs answered with a range of a block file (`_read_version`) are spliced from it."""
    enable_parallel_dirops = True
    """LOOKUPs and READDIRs of one directory may run side by side: a lookup that waits for
    the store (a listing, the GET that describes a small file) then holds up no other name of
    its directory. Safe because the namespace serves lookups of different directories side by
    side already (its state under one lock, a listing's fetch shared by every caller that
    waits for it), so two in one directory are no new case, and because the kernel still
    serializes what must be: lookups of one name wait for each other, and every change to a
    directory (create, unlink, rename, mkdir) holds its lock exclusively."""

    def __init__(self, namespace: Namespace, stack: TierStack, options: MountOptions,
                 xattrs: dict[str, str]) -> None:
        super().__init__()
        self.namespace = namespace
        self.writeback = namespace.writeback
        self.stack = stack
        self.options = options
        self.xattrs = {_XATTR_PREFIX + name.encode(): value.encode()
                       for name, value in xattrs.items()}
        self._open: dict[int, OpenFile] = {}
        self._handles: dict[int, set[int]] = {}
        """Open handles (fh) of each inode that has any."""
        self._orphans: dict[int, Pending] = {}
        """Inodes deleted or renamed over while open: the state their handles keep."""
        self._dirs: dict[int, OpenDirectory] = {}
        self._kernel_listings: dict[int, int] = {}
        """Per directory inode, the signature (`_listed`) of the entries the kernel last read
        to their end, which it keeps in its page cache (`CACHES_DIRECTORIES`): an open keeps
        that cache only while the directory's signature is still the same."""
        self._built: dict[int, tuple[ObjectInfo | None, pyfuse3.EntryAttributes]] = {}
        """The attributes last built for an inode with nothing pending, and the metadata they
        were built from: a walk asks for the attributes of every entry at every readdir, and
        building them is most of what answering an entry costs. Reused while the metadata is
        the same object (a listing fetched again, or a file's attributes read, makes a new
        one); dropped with the node when the kernel forgets the inode, so, like the nodes, they
        are bounded by the kernel's inode cache (about 280 bytes each)."""
        self._opens = self.writeback is not None or not READS_NAME_INODE
        """Whether files are opened. A read-only mount answers OPEN with ENOSYS where pyfuse3
        lets a read name its inode: the kernel then sends neither OPEN nor RELEASE and keeps
        each file's pages (it drops them when a file's size or mtime changes), so a file read
        again never reaches the daemon. Without opens no reader pins the version it opened:
        a file replaced in the store is read on from its new version once the metadata TTL
        has passed, its pages dropped then (`_version_reader`)."""
        self._readers: dict[int, OpenFile] = {}
        """Without opens, each inode's reader of its current version, until it is forgotten."""
        self._next_fh = 0
        self._threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="avafs-request")
        """Where every request that may block runs; the bound keeps a burst of slow LISTs or
        HEADs from starting a thread each."""
        self._background: set[asyncio.Task[None]] = set()
        """Tasks no request waits for (`_in_background`), held here until done: the loop
        keeps only weak references to its tasks."""
        self._read_ahead = DirectoryReadAhead(namespace, stack, stack.metrics.read_ahead_files,
                                              describe=not options.listing_attrs)
        self._timeout = min(options.effective_metadata_ttl, _KERNEL_TIMEOUT_CAP)
        self._uid = os.getuid() if options.uid is None else options.uid
        self._gid = os.getgid() if options.gid is None else options.gid
        self._started_ns = time.time_ns()

    def _new_fh(self) -> int:
        self._next_fh += 1
        return self._next_fh

    def _register(self, handle: OpenFile) -> int:
        fh = self._new_fh()
        self._open[fh] = handle
        self._handles.setdefault(handle.inode, set()).add(fh)
        return fh

    async def _blocking(self, function: Callable[..., T], *args: object) -> T:
        with as_fuse_error():
            return await asyncio.get_running_loop().run_in_executor(self._threads, function,
                                                                    *args)

    def _in_background(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        """After the request loop has ended: waits for the requests' threads to finish."""
        self._threads.shutdown(wait=True)

    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent = self.namespace.node(parent_inode)
        text = os.fsdecode(name)
        if text == ".":
            return self._attributes(parent)
        if text == "..":
            return self._attributes(self.namespace.node(parent.parent))
        self._check_name(name)
        entry = self.namespace.cached_entry(parent, text)
        if entry is False:
            node = await self._blocking(self.namespace.lookup, parent, text)
        else:
            node = self.namespace.child(parent, entry) if entry else None
        if node is None:
            negative = self._negative_entry()
            if self.namespace.absence_guessed(parent, text):
                negative.entry_timeout = 0  # guessed while the store is unreachable: ask again
            return negative
        return await self._described(node, lookup=True, reader=_reader(ctx))

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:
        return await self._described(self.namespace.node(inode), reader=_reader(ctx))

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self._forget(inode, count)

    def _forget(self, inode: int, count: int) -> None:
        if self.namespace.forget(inode, count):
            self._built.pop(inode, None)
            self._readers.pop(inode, None)
            self._kernel_listings.pop(inode, None)

    async def statfs(self, ctx=None) -> pyfuse3.StatvfsData:
        space = self.stack.space(self.writeback.dirty_bytes if self.writeback else 0)
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = space.total_bytes // 4096
        data.f_bfree = data.f_bavail = space.free_bytes // 4096
        data.f_files = space.total_files
        data.f_ffree = data.f_favail = space.free_files
        data.f_namemax = 255
        return data

    async def getxattr(self, inode: int, name: bytes, ctx=None) -> bytes:
        """Every directory answers the daemon's xattrs, so a bind mount of a subdirectory (a
        pod's subPath) still finds its control socket."""
        if name in self.xattrs and self.namespace.node(inode).is_dir:
            return self.xattrs[name]
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode: int, ctx=None) -> list[bytes]:
        return list(self.xattrs) if self.namespace.node(inode).is_dir else []

    async def open(self, inode: int, flags: int, ctx=None) -> pyfuse3.FileInfo:
        if not self._opens:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        node = self.namespace.node(inode)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & _WRITE_FLAGS:
            handle = await self._open_writer(node, truncate=bool(flags & os.O_TRUNC))
            return pyfuse3.FileInfo(fh=self._register(handle), keep_cache=False)
        pending = self._orphans.get(inode) or (
            self.writeback.get(node.source, node.key) if self.writeback else None)
        if pending is not None and pending.kind == DATA:
            try:
                handle = self._local_handle(inode, pending, os.O_RDONLY)
            except pyfuse3.FUSEError as error:
                if error.errno != errno.ESTALE:
                    raise  # else uploaded meanwhile: read what the store has
            else:
                return pyfuse3.FileInfo(fh=self._register(handle), keep_cache=True, **READER)
        ref = await self._current_ref(node)
        keep_cache = node.kernel_cached_etag == ref.etag
        node.kernel_cached_etag = ref.etag
        if not keep_cache:
            self.stack.expect_read(ref)
        handle = OpenFile(inode, ref=ref, read_ahead=self.stack.new_read_ahead())
        return pyfuse3.FileInfo(fh=self._register(handle), keep_cache=keep_cache, **READER)

    async def _current_ref(self, node: Node) -> ObjectRef:
        """What reading the file means now: its clean version, revalidated after the TTL, or
        for a rename still being copied in the store, the version it was renamed from."""
        renamed = self.namespace.renamed_from(node.source, node.key)
        if renamed is not None:
            return renamed
        info = self.namespace.current_info(node)
        if not self.namespace.is_fresh(node.checked_at):
            info = await self._blocking(self.namespace.revalidate, node)
        if info is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.namespace.object_ref(node.source, info)

    def _local_handle(self, inode: int, pending: Pending, flags: int) -> OpenFile:
        """A handle on the state's data file; ESTALE if the file is gone, its state settled
        since it was looked up (the store has it then)."""
        if not self.writeback.hold_file(pending.file):
            raise pyfuse3.FUSEError(errno.ESTALE)
        try:
            with as_fuse_error():
                fd = os.open(self.writeback.data_path(pending), flags)
        except pyfuse3.FUSEError:
            self.writeback.drop_file(pending.file)
            raise
        return OpenFile(inode, fd=fd, pending=pending, writable=flags != os.O_RDONLY)

    async def read(self, fh: int, off: int, size: int) -> Piece | pyfuse3.FileRange:
        handle = self._open[fh] if self._opens else await self._version_reader(fh)
        if handle.ref is None:
            return os.pread(handle.fd, size, off)
        if off == 0 and self.options.listing_attrs:
            self._read_ahead.reached(self.namespace.node(handle.inode))
        try:
            return await self._read_version(handle, off, size)
        except pyfuse3.FUSEError as error:
            node = self.namespace.node(handle.inode)
            if error.errno != errno.ESTALE or node.key == handle.ref.key:
                raise
        # Opened while its rename was being copied in the store, it read the version it was
        # renamed from, which the rename deletes once the copy has landed: the copy is the
        # same bytes.
        handle.ref = await self._current_ref(node)
        handle.read_ahead = self.stack.new_read_ahead()
        return await self._read_version(handle, off, size)

    async def _version_reader(self, inode: int) -> OpenFile:
        """Without opens, the reader of the inode's current version. When the version changed
        since the inode was last read, the kernel may hold pages of the old one: they are
        dropped from a task of their own, since dropping them waits for the pages this read
        fills, which a request handler waiting for it would never send."""
        node = self.namespace.node(inode)
        ref = await self._current_ref(node)
        handle = self._readers.get(inode)
        if handle is None or handle.ref != ref:
            if handle is not None:
                self._in_background(drop_pages(inode, self._threads))
            handle = self._readers[inode] = OpenFile(inode, ref=ref,
                                                     read_ahead=self.stack.new_read_ahead())
            node.kernel_cached_etag = ref.etag
        return handle

    async def _read_version(self, handle: OpenFile, off: int, size: int
                            ) -> Piece | pyfuse3.FileRange:
        with as_fuse_error():
            answer = await self.stack.read_async(handle.ref, off, size, handle.read_ahead,
                                                 self._threads, file_ranges=FILE_RANGES)
            if not isinstance(answer, BlockFileRange):
                return answer
            try:
                fd = os.open(answer.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = -1
            if fd >= 0 and os.fstat(fd).st_size >= answer.offset + answer.length:
                return pyfuse3.FileRange(fd, answer.offset, answer.length)
            # Evicted since, or cut short (a splice would end the READ early, and the reader
            # would take that for the file's end): read as a block the tiers lack.
            if fd >= 0:
                os.close(fd)
            return await self._blocking(self.stack.read, handle.ref, off, size)

    async def release(self, fh: int) -> None:
        handle = self._open.pop(fh, None)
        if handle is None:
            return
        handles = self._handles[handle.inode]
        handles.discard(fh)
        if not handles:
            del self._handles[handle.inode]
        self._close(handle)
        if handle.inode in self._orphans:
            self._keep_orphan(handle.inode)

    def _close(self, handle: OpenFile) -> None:
        if handle.fd < 0:
            return
        os.close(handle.fd)
        if handle.writable:
            self.writeback.release_writer(handle.pending)
        self.writeback.drop_file(handle.pending.file)

    @staticmethod
    def _check_name(name: bytes) -> None:
        if len(name) > NAME_MAX:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        if not valid_name(os.fsdecode(name)):
            raise pyfuse3.FUSEError(errno.EINVAL)

    def _check_writable_directory(self, directory: Node) -> None:
        if self.writeback is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        if directory.inode == ROOT_INODE and not self.namespace.single_source:
            raise pyfuse3.FUSEError(errno.EACCES)

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx=None) -> None:
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    async def removexattr(self, inode: int, name: bytes, ctx=None) -> None:
        raise pyfuse3.FUSEError(errno.ENOTSUP)


def _reader(ctx: pyfuse3.RequestContext | None) -> int | None:
    """Who sends the request: the kernel names the calling thread (its id; a process's only
    thread has the process's), which the directory read-ahead follows on its own."""
    return ctx.pid if ctx is not None else None
