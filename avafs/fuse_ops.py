"""FUSE operations: translate kernel requests to namespace and tier calls, and nothing else.

Anything that may block (a LIST, a HEAD) runs in a worker thread; answers that are already in
memory (fresh listings) are given inline, because a thread hop costs more than the answer.
Reads of clean data go to `TierStack.read_async`, which makes the same choice for blocks and
keeps each open file's read-ahead; the handlers here share one pool of worker threads with
it (`_threads`). The kernel's own caches
are used on purpose: entry and attribute timeouts follow `--metadata-ttl`, negative lookups are
cached as well, and `keep_cache` is set when a file is reopened at an unchanged ETag, so warm
re-reads come from the page cache. Not the kernel's write-back cache (`enable_writeback_cache`):
with it the kernel trusts its own size and mtime of a cached file over the daemon's, so an
object replaced in the store would keep its old length.

A file deleted or renamed over while open lives on for its open handles, as on a local file
system: written data stays in its local data file (the write-back state the handles hold, no
longer any key's), a clean version being read is first copied to one, and the inode answers from
that state (`_orphans`) until its last close frees it. Nothing of it is uploaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import pyfuse3

from .config.options import MountOptions
from .errors import ObjectChangedError, StoreError
from .namespace import NAME_MAX, ROOT_INODE, Entry, Namespace, Node, Refused, valid_name
from .objects import ObjectRef
from .stores.base import ObjectInfo
from .stores.metadata import SPECIAL_TYPES, Attrs
from .tiers.readahead import ReadAhead
from .tiers.stack import TierStack
from .writeback.pending import DATA, Pending

log = logging.getLogger(__name__)

T = TypeVar("T")
_KERNEL_TIMEOUT_CAP = 365 * 86400.0
_XATTR_PREFIX = b"user.avafs."
_NO_ATTRS = Attrs()
"""What a file whose object names no mode or owner shows: the mount's defaults."""
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT
_READER = {"noflush": True} if hasattr(pyfuse3.FileInfo(), "noflush") else {}
"""What a read-only open answers beside its handle: FOPEN_NOFLUSH where pyfuse3 exposes it
(third_party/pyfuse3's patch, which scripts/install.sh builds), so that closing a reader sends
no FLUSH, which would have nothing to commit; with stock pyfuse3 every close is a round trip.
FLUSH carries no lock release here: pyfuse3 has no lock requests, so the kernel keeps POSIX
locks itself."""
_READS_NAME_INODE = getattr(pyfuse3, "READS_NAME_INODE_WITHOUT_OPEN", False)
"""Whether a read sent without an open names its inode (third_party/pyfuse3's patch; stock
pyfuse3 gives it the handle, 0 for every file then)."""
_CACHES_DIRECTORIES = hasattr(pyfuse3.FileInfo(), "cache_readdir")
"""Whether opendir can ask the kernel to keep a directory's entries (third_party/pyfuse3's
patch; stock pyfuse3 takes a handle only, and every read of a directory is a request)."""


@dataclass(slots=True)
class OpenFile:
    """A handle reads cached blocks of an object version (`ref`), or a local dirty file
    (`fd`), which writers always use."""

    inode: int
    ref: ObjectRef | None = None
    fd: int = -1
    pending: Pending | None = None
    writable: bool = False
    read_ahead: ReadAhead | None = None
    """The tier stack's read-ahead state for this reader of `ref`."""


@dataclass(slots=True)
class OpenDirectory:
    node: Node
    entries: list[Entry] | None = None
    """The listing this handle pages through, fixed at its first readdir for consistency."""


_REFUSALS = frozenset({errno.EFBIG, errno.ENAMETOOLONG, errno.EINVAL, errno.EEXIST,
                       errno.ENOENT, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR, errno.EPERM,
                       errno.EACCES})
"""What the local disk answers a request it refuses as asked (a size past what it holds):
the caller's mistake, not the disk's failure, so not an error of the daemon's log."""

def _errno_of(error: Exception) -> int:
    """A failure of the local disk or the store as the errno the caller gets: any other
    exception out of a handler would end pyfuse3's main loop, and with it the mount for every
    user. One that is none of these is a bug: logged with its traceback, answered EIO."""
    if isinstance(error, Refused):
        return error.errno
    if isinstance(error, OSError):
        log.log(logging.INFO if error.errno in _REFUSALS else logging.ERROR, "%s", error)
        return error.errno or errno.EIO
    if isinstance(error, ObjectChangedError):
        log.warning("%s", error)
        return errno.ESTALE
    if isinstance(error, StoreError):
        log.error("%s", error)
        return errno.EIO
    log.error("a request failed unexpectedly; answered EIO", exc_info=error)
    return errno.EIO


@contextlib.contextmanager
def _as_fuse_error() -> Iterator[None]:
    """`_errno_of` for a block of a handler."""
    try:
        yield
    except pyfuse3.FUSEError:
        raise
    except Exception as error:
        raise pyfuse3.FUSEError(_errno_of(error)) from None


_HANDLERS = frozenset(name for name in vars(pyfuse3.Operations)
                      if not name.startswith("_") and name not in
                      ("init", "stacktrace", "supports_dot_lookup", "enable_acl",
                       "enable_writeback_cache"))
"""The methods pyfuse3 calls for kernel requests."""


def _guarded(operations: type[pyfuse3.Operations]) -> type[pyfuse3.Operations]:
    """Every request handler of the class answered through `_errno_of`, so that no
    request, whatever fails under it, can end the daemon. The handlers keep their own checks
    and their own ordering of side effects: this is the last line, not the error handling."""
    for name in _HANDLERS & set(vars(operations)):
        handler = vars(operations)[name]

        @functools.wraps(handler)
        async def guarded(*args: object, _handler=handler, **kwargs: object) -> object:
            try:
                return await _handler(*args, **kwargs)
            except pyfuse3.FUSEError:
                raise
            except Exception as error:
                raise pyfuse3.FUSEError(_errno_of(error)) from None

        setattr(operations, name, guarded)
    return operations


async def _drop_pages(inode: int, threads: Executor) -> None:
    """The kernel's cached pages of an inode, dropped from a worker thread (the kernel
    answers when the pages being read are filled). An inode the kernel has forgotten has none."""
    with contextlib.suppress(OSError):
        await asyncio.get_running_loop().run_in_executor(threads, pyfuse3.invalidate_inode,
                                                         inode)


@_guarded
class AvafsOperations(pyfuse3.Operations):
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
        to their end, which it keeps in its page cache (`_CACHES_DIRECTORIES`): an open keeps
        that cache only while the directory's signature is still the same."""
        self._built: dict[int, tuple[ObjectInfo | None, pyfuse3.EntryAttributes]] = {}
        """The attributes last built for an inode with nothing pending, and the metadata they
        were built from: a walk asks for the attributes of every entry at every readdir, and
        building them is most of what answering an entry costs. Reused while the metadata is
        the same object (a listing fetched again, or a file's attributes read, makes a new
        one); dropped with the node when the kernel forgets the inode, so, like the nodes, they
        are bounded by the kernel's inode cache (about 280 bytes each)."""
        self._opens = self.writeback is not None or not _READS_NAME_INODE
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
        with _as_fuse_error():
            return await asyncio.get_running_loop().run_in_executor(self._threads, function,
                                                                    *args)

    def _in_background(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def close(self) -> None:
        """After the request loop has ended: waits for the requests' threads to finish."""
        self._threads.shutdown(wait=True)

    # --- attributes ------------------------------------------------------------------------

    def _attributes(self, node: Node, listed_in: str | None = None) -> pyfuse3.EntryAttributes:
        """A file's mode, owner, type and times are its object's where it names them, else
        the mount's defaults. Attributes not read from the object yet (a readdir answers from
        the listing) are given with no timeout, so a stat comes back for them. A
        file deleted while open shows its local state, with no link left. `listed_in`: the
        prefix of the listing that named the node, where the caller knows it (a readdir)."""
        if node.is_dir:
            return self._directory_attributes(node)
        orphan = self._orphans.get(node.inode)
        if orphan is not None:
            state: Pending | None = orphan
            info: ObjectInfo | None = self.writeback.info(orphan)
        else:
            state = self.writeback.get(node.source, node.key) if self.writeback else None
            info = self.namespace.info_with(node, state, listed_in)
        if state is None:
            built = self._built.get(node.inode)
            if built is not None and built[0] is info:
                return built[1]
        attrs = self._new_attributes(node, info)
        if self._undescribed(info):
            # Nor the entry: its type may not be a regular file's (a link), and the kernel
            # cannot change an inode's type, only look the name up again and make a new one.
            attrs.attr_timeout = attrs.entry_timeout = 0
        if info is not None:
            attrs.st_nlink = 0 if orphan else 1
            attrs.st_size = info.size
            if state is not None and state.allocated is not None:
                attrs.st_blocks = state.allocated // 512  # a sparse file written here
            else:
                attrs.st_blocks = -(-info.size // 512)
        if state is None:
            self._built[node.inode] = (info, attrs)
        return attrs

    def _new_attributes(self, node: Node, info: ObjectInfo | None) -> pyfuse3.EntryAttributes:
        """What a file and a directory share: owner, mode and type, times. A time the object
        does not keep reads as its mtime (atime: reads do not advance it; ctime: the mtime,
        unless a change of attributes or a rename set it later)."""
        kept = (info.attrs if info is not None else None) or _NO_ATTRS
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = node.inode
        attrs.entry_timeout = self._timeout
        attrs.attr_timeout = self._timeout
        attrs.st_uid = self._uid if kept.uid is None else kept.uid
        attrs.st_gid = self._gid if kept.gid is None else kept.gid
        attrs.st_blksize = 128 * 1024
        if node.is_dir:
            mode = self.options.dir_mode
        else:
            mode = 0o777 if kept.file_type == stat.S_IFLNK else self.options.file_mode
        file_type = stat.S_IFDIR if node.is_dir else kept.file_type or stat.S_IFREG
        attrs.st_mode = file_type | (mode if kept.mode is None else kept.mode)
        attrs.st_rdev = kept.rdev or 0
        mtime = self._started_ns / 1e9 if info is None else info.mtime
        attrs.st_mtime_ns = round(mtime * 1e9)
        attrs.st_atime_ns = round((mtime if kept.atime is None else kept.atime) * 1e9)
        attrs.st_ctime_ns = round((mtime if kept.ctime is None else kept.ctime) * 1e9)
        return attrs

    def _directory_attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        """A directory's attributes are its marker object's where it has one, else the
        mount's; its mtime and ctime advance with the entries this mount changes in it. Its
        link count is 2 and one per subdirectory where its listing is cached, else 1 (what
        tools read as "not counted")."""
        marker = self.namespace.directory_info(node)
        attrs = self._new_attributes(node, marker)
        if self._undescribed_directory(node):
            attrs.attr_timeout = 0
        changed = node.entries_changed_at
        if changed is not None:
            changed_ns = round(changed * 1e9)
            attrs.st_mtime_ns = max(attrs.st_mtime_ns, changed_ns)
            attrs.st_ctime_ns = max(attrs.st_ctime_ns, changed_ns)
        subdirectories = self.namespace.subdirectories(node)
        attrs.st_nlink = 1 if subdirectories is None else 2 + subdirectories
        return attrs

    def _undescribed_directory(self, node: Node) -> bool:
        """Whether a directory's marker must still be read from the store."""
        return bool(node.key) and not self.options.listing_attrs and \
            not self.namespace.is_fresh(node.marker_read_at)

    def _undescribed(self, info: ObjectInfo | None) -> bool:
        """Whether a file's attributes must still be read from its object."""
        return info is not None and info.attrs is None and not self.options.listing_attrs

    async def _described(self, node: Node) -> pyfuse3.EntryAttributes:
        """The node's attributes, its object's metadata read first where needed (one HEAD)."""
        if node.is_dir:
            if self._undescribed_directory(node):
                await self._blocking(self.namespace.describe_directory, node)
            return self._attributes(node)
        if not self.options.listing_attrs:
            await self._info_with_attrs(node)
        if not self._opens:
            await self._drop_replaced_pages(node)
        return self._attributes(node)

    async def _drop_replaced_pages(self, node: Node) -> None:
        """Without opens, the kernel drops a file's pages itself only when the attributes it
        is given show another size or mtime; a version replaced by one of the same size and
        mtime has its pages dropped here, before the lookup or getattr that found it is
        answered (no read of the file can be waiting on this handler)."""
        info = self.namespace.current_info(node)
        if info is not None and node.kernel_cached_etag not in (None, info.etag):
            node.kernel_cached_etag = None
            await _drop_pages(node.inode, self._threads)

    async def _info_with_attrs(self, node: Node) -> ObjectInfo | None:
        info = self.namespace.current_info(node)
        if info is not None and info.attrs is None:
            info = await self._blocking(self.namespace.describe, node)
        return info

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
        return await self._described(node)

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:
        return await self._described(self.namespace.node(inode))

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

    # --- directories -------------------------------------------------------------------------

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
        if not _CACHES_DIRECTORIES:
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
            if _CACHES_DIRECTORIES:  # the empty answer that ends the kernel's read of them all
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

    # --- files ---------------------------------------------------------------------------------

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
                return pyfuse3.FileInfo(fh=self._register(handle), keep_cache=True, **_READER)
        ref = await self._current_ref(node)
        keep_cache = node.kernel_cached_etag == ref.etag
        node.kernel_cached_etag = ref.etag
        if not keep_cache:
            self.stack.expect_read(ref)
        handle = OpenFile(inode, ref=ref, read_ahead=self.stack.new_read_ahead())
        return pyfuse3.FileInfo(fh=self._register(handle), keep_cache=keep_cache, **_READER)

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
            with _as_fuse_error():
                fd = os.open(self.writeback.data_path(pending), flags)
        except pyfuse3.FUSEError:
            self.writeback.drop_file(pending.file)
            raise
        return OpenFile(inode, fd=fd, pending=pending, writable=flags != os.O_RDONLY)

    async def _open_writer(self, node: Node, truncate: bool) -> OpenFile:
        """Rewriting a file keeps its mode and owner, so they are read first if need be."""
        self._check_writable(node)
        orphan = self._orphans.get(node.inode)
        if orphan is not None:  # reopened through /proc/PID/fd after its deletion
            handle = self._local_handle(node.inode, orphan, os.O_RDWR)
            if truncate:
                await self._truncate(handle, 0)
            return handle
        base = None if truncate else await self._current_ref(node)
        info = await self._info_with_attrs(node)
        handle = await self._writer(node.inode, node.source, node.key, base,
                                    info.attrs if info else None)
        if truncate and handle.pending.size:  # data written before, still open or not uploaded
            await self._truncate(handle, 0)
        return handle

    async def _writer(self, inode: int, source: str, key: str, base: ObjectRef | None,
                      attrs: Attrs | None) -> OpenFile:
        """A handle on the key's local data file, made from `base` unless it is None (a new
        or truncated file). With nothing to copy in there is nothing to wait for: the empty
        data file is made right here, as a read from the disk tier is: creating an empty
        file costs less than the thread hop there and back."""
        if base is None:
            with _as_fuse_error():
                pending = self.writeback.open_writer(source, key, None, True, attrs)
        else:
            pending = await self._blocking(self.writeback.open_writer, source, key, base, False,
                                           attrs)
        try:
            return self._local_handle(inode, pending, os.O_RDWR)
        except pyfuse3.FUSEError:
            self.writeback.release_writer(pending)
            raise

    def _check_writable(self, node: Node) -> None:
        if self.writeback is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        if node.inode == ROOT_INODE or (node.parent == ROOT_INODE
                                        and not self.namespace.single_source and node.is_dir):
            raise pyfuse3.FUSEError(errno.EACCES)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._open[fh] if self._opens else await self._version_reader(fh)
        if handle.ref is None:
            return os.pread(handle.fd, size, off)
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
                self._in_background(_drop_pages(inode, self._threads))
            handle = self._readers[inode] = OpenFile(inode, ref=ref,
                                                     read_ahead=self.stack.new_read_ahead())
            node.kernel_cached_etag = ref.etag
        return handle

    async def _read_version(self, handle: OpenFile, off: int, size: int) -> bytes:
        with _as_fuse_error():
            return await self.stack.read_async(handle.ref, off, size, handle.read_ahead,
                                               self._threads)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._open[fh]
        if not handle.writable:
            raise pyfuse3.FUSEError(errno.EBADF)
        await self._apply_back_pressure()
        self.writeback.wrote(handle.pending, off, off + len(buf))
        try:
            written = os.pwrite(handle.fd, buf, off)
        except OSError:
            self._rolled_back(handle)
            raise
        if written < len(buf):
            self._rolled_back(handle)
        self.writeback.appended(handle.pending, off, off + written)
        if handle.pending.allocated is not None:
            self.writeback.measure(handle.pending, handle.fd)
        return written

    async def _apply_back_pressure(self) -> None:
        """A write waits, without holding the loop, for as long as write-back has no room."""
        while True:
            with _as_fuse_error():
                if self.writeback.room_to_write():
                    return
            await asyncio.sleep(0.05)

    async def flush(self, fh: int) -> None:
        """Commits what a writer wrote. Readers are opened with FOPEN_NOFLUSH where pyfuse3
        allows it (`_READER`); a read-only mount, where nothing is written, answers ENOSYS
        besides, after which the kernel stops sending FLUSH at all, whatever pyfuse3 allows.
        A file read without either takes four round trips: open, read, flush, release."""
        if self.writeback is None:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        handle = self._open[fh]
        if handle.writable:
            await self._blocking(self.writeback.commit, handle.pending, handle.fd)

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.flush(fh)

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

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx=None) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        parent = self.namespace.node(parent_inode)
        self._check_writable_directory(parent)
        text = os.fsdecode(name)
        self._check_name(name)
        if not flags & (os.O_TRUNC | os.O_EXCL) and self.namespace.absence_guessed(parent, text):
            log.error("cannot tell whether %r exists in %s, which does not answer: only "
                      "O_TRUNC or O_EXCL creates are taken until it does", parent.key + text,
                      self.namespace.stores[parent.source].url)
            raise pyfuse3.FUSEError(errno.EIO)
        with _as_fuse_error():
            self.namespace.check_key(parent, text)
        handle = await self._writer(0, parent.source, parent.key + text, None,
                                    self._creator_attrs(parent, mode, ctx))
        node = self.namespace.child(parent, Entry(text, self.writeback.info(handle.pending)))
        handle.inode = node.inode
        self.namespace.entries_changed(parent)
        return pyfuse3.FileInfo(fh=self._register(handle)), self._attributes(node)

    @staticmethod
    def _check_name(name: bytes) -> None:
        if len(name) > NAME_MAX:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        if not valid_name(os.fsdecode(name)):
            raise pyfuse3.FUSEError(errno.EINVAL)

    def _creator_attrs(self, parent: Node, mode: int, ctx: pyfuse3.RequestContext) -> Attrs:
        """A new file keeps the mode it was created with, and its creator as owner where that
        is not the mount's default owner (another user of an --allow-other mount) and the
        store can keep it. Its group, as on Linux: the parent's if the parent is set-group-ID
        (a directory made there is too); else, on a mount given a --gid (a pod's fsGroup),
        that group, as in a set-group-ID directory: what kubelet makes of a volume for an
        fsGroup; else its creator's."""
        keeps_owners = self.namespace.stores[parent.source].keeps_owners()
        foreign = ctx.uid != self._uid and keeps_owners
        file_type = stat.S_IFMT(mode)
        permissions = stat.S_IMODE(mode)
        shown = self._directory_attributes(parent)
        gid = None
        if shown.st_mode & stat.S_ISGID:
            gid = shown.st_gid
            if file_type == stat.S_IFDIR:
                permissions |= stat.S_ISGID
        elif self.options.gid is not None:
            gid = self.options.gid  # kept with the file: a file:// bucket's files show their own
        elif ctx.gid != self._gid and keeps_owners:
            gid = ctx.gid
        return Attrs(mode=permissions, uid=ctx.uid if foreign else None,
                     gid=gid if keeps_owners else None,
                     file_type=None if file_type in (0, stat.S_IFREG) else file_type)

    def _check_writable_directory(self, directory: Node) -> None:
        if self.writeback is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        if directory.inode == ROOT_INODE and not self.namespace.single_source:
            raise pyfuse3.FUSEError(errno.EACCES)

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields, fh: int | None,
                      ctx=None) -> pyfuse3.EntryAttributes:
        """Size (truncate), and the times, mode and owner of a file or a directory, which its
        object (a directory's: its marker) keeps in its metadata (a file the store has gets
        them without sending its data again). Any of them sets the ctime. The kernel has
        checked who may change what (default_permissions)."""
        node = self.namespace.node(inode)
        if fields.update_size:
            if node.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            handle = self._open.get(fh) if fh is not None else None
            if handle is not None and handle.writable:
                await self._truncate(handle, attr.st_size)
            else:
                handle = await self._open_writer(node, truncate=attr.st_size == 0)
                try:
                    await self._truncate(handle, attr.st_size)
                    await self._blocking(self.writeback.commit, handle.pending, handle.fd)
                finally:
                    self._close(handle)
        if node.is_dir and not node.key:
            self._check_root_attributes(attr, fields)
        elif fields.update_mtime or fields.update_atime or fields.update_mode or \
                fields.update_uid or fields.update_gid:
            await self._set_attributes(node, attr, fields)
        return self._attributes(node)

    def _check_root_attributes(self, attr: pyfuse3.EntryAttributes,
                               fields: pyfuse3.SetattrFields) -> None:
        """The root of a source has no marker to keep attributes on: it keeps the mount's
        (`--dir-mode`, `--uid`, `--gid`), and changing them is refused."""
        if (fields.update_mode and stat.S_IMODE(attr.st_mode) != self.options.dir_mode) or \
                (fields.update_uid and attr.st_uid != self._uid) or \
                (fields.update_gid and attr.st_gid != self._gid):
            raise pyfuse3.FUSEError(errno.EPERM)

    async def _set_attributes(self, node: Node, attr: pyfuse3.EntryAttributes,
                              fields: pyfuse3.SetattrFields) -> None:
        """A directory's go on its marker, written anew; the root of a source has none, and
        keeps the mount's."""
        self._check_writable(node)
        if (fields.update_uid or fields.update_gid) and \
                not self.namespace.stores[node.source].keeps_owners():
            raise pyfuse3.FUSEError(errno.EPERM)
        if node.is_dir:
            info = await self._blocking(self.namespace.describe_directory, node)
            shown = self._directory_attributes(node)
        else:
            info = await self._info_with_attrs(node)
            if info is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            shown = None
        kept = (info.attrs if info is not None else None) or Attrs()
        now = time.time()
        if fields.update_mtime:
            mtime = attr.st_mtime_ns / 1e9
        else:
            mtime = shown.st_mtime_ns / 1e9 if shown is not None else info.mtime
        atime = attr.st_atime_ns / 1e9 if fields.update_atime else kept.atime
        changed = Attrs(
            mode=stat.S_IMODE(attr.st_mode) if fields.update_mode else kept.mode,
            uid=attr.st_uid if fields.update_uid else kept.uid,
            gid=attr.st_gid if fields.update_gid else kept.gid,
            file_type=stat.S_IFDIR if node.is_dir else kept.file_type, rdev=kept.rdev,
            atime=atime, ctime=now)
        await self._blocking(self.writeback.set_attributes, node.source, node.key,
                             None if node.is_dir else info, mtime, changed)
        if node.is_dir:
            node.entries_changed_at = None

    async def _truncate(self, handle: OpenFile, size: int) -> None:
        self.writeback.truncated(handle.pending, size)
        try:
            os.ftruncate(handle.fd, size)
        except OSError:
            self._rolled_back(handle)
            raise
        if handle.pending.allocated is not None:
            self.writeback.measure(handle.pending, handle.fd)

    def _rolled_back(self, handle: OpenFile) -> None:
        """After a write or truncate of the data file failed (EFBIG past the size the cache's
        file system allows, ENOSPC): write-back, told of it first so that an upload in flight
        knows its snapshot is stale, is told the length the file really has."""
        self.writeback.truncated(handle.pending, os.fstat(handle.fd).st_size)

    # --- namespace changes ---------------------------------------------------------------------

    async def _existing(self, parent: Node, name: bytes) -> tuple[str, Entry]:
        text = os.fsdecode(name)
        entry = await self._blocking(self.namespace.entry, parent, text)
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return text, entry

    async def unlink(self, parent_inode: int, name: bytes, ctx=None) -> None:
        parent = self.namespace.node(parent_inode)
        self._check_writable_directory(parent)
        text, entry = await self._existing(parent, name)
        if entry.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        node = self.namespace.node_of(parent, text)
        if node is not None:
            await self._keep_reading([node])
        await self._blocking(self.writeback.unlink, parent.source, parent.key + text)
        self.namespace.entries_changed(parent)
        if node is not None:
            self._orphan(node)

    async def _keep_reading(self, nodes: list[Node]) -> None:
        """Handles reading a clean version of these files switch to a local copy of it, before
        a deletion or rename that takes that version from the store is journaled. Best
        effort: if the store cannot send it, the change goes ahead and such readers may fail
        once it reaches the store, as they would have without the copy."""
        copies: dict[tuple[int, str], Pending] = {}
        try:
            for node in nodes:
                for fh in list(self._handles.get(node.inode, ())):
                    handle = self._open.get(fh)
                    if handle is None or handle.ref is None:
                        continue  # closed while a copy was made, or reading local data
                    version = (node.inode, handle.ref.etag)
                    if version not in copies:
                        info = self.namespace.current_info(node)
                        try:
                            copies[version] = await self._blocking(
                                self.writeback.keep_copy, node.source, handle.ref,
                                info.mtime if info else time.time())
                        except pyfuse3.FUSEError:
                            log.warning("could not copy %s for its open readers before it is "
                                        "deleted or renamed", handle.ref.key)
                            continue
                    if self._open.get(fh) is handle:
                        self._open[fh] = self._local_handle(node.inode, copies[version],
                                                            os.O_RDONLY)
        finally:
            for copy in copies.values():
                self.writeback.drop_file(copy.file)

    def _orphan(self, node: Node) -> None:
        """The file was deleted or renamed over: its name no longer leads to its inode, which
        keeps its data for its open handles."""
        self.namespace.detach(node)
        if node.inode in self._handles:
            self._keep_orphan(node.inode)

    def _keep_orphan(self, inode: int) -> None:
        """The state an inode deleted while open answers from: its writers' (the latest),
        else that of any handle open on local data; none once they are all closed."""
        handles = [self._open[fh] for fh in self._handles.get(inode, ())]
        kept = [handle for handle in handles if handle.pending is not None]
        if kept:
            self._orphans[inode] = max(kept, key=lambda handle: handle.writable).pending
        else:
            self._orphans.pop(inode, None)

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

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx=None) -> None:
        """Within one source; the namespace checks and plans it (`Namespace.plan_rename`). A
        directory rename moves every key under it: on S3 that is a copy and a delete per key,
        so it is not atomic in the store, but it is one journal batch, so after a crash it
        completes on the next mount. Handles reading a version the rename takes from the
        store switch to a local copy of it before it is journaled."""
        old_parent = self.namespace.node(parent_inode_old)
        new_parent = self.namespace.node(parent_inode_new)
        self._check_writable_directory(old_parent)
        self._check_writable_directory(new_parent)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if old_parent.source != new_parent.source:
            raise pyfuse3.FUSEError(errno.EXDEV)
        self._check_name(name_new)
        plan = await self._blocking(self.namespace.plan_rename, old_parent,
                                    os.fsdecode(name_old), new_parent, os.fsdecode(name_new),
                                    not flags & pyfuse3.RENAME_NOREPLACE)
        open_nodes = (self.namespace.node(inode) for inode in self._handles)
        readers = [node for node in open_nodes if plan.takes_key_of(node)]
        if plan.replaced is not None:
            readers.append(plan.replaced)
        await self._keep_reading(readers)
        if plan.renamed is not None and not plan.is_dir:
            await self._info_with_attrs(plan.renamed)  # so the rename can set its ctime
        await self._blocking(self.namespace.rename, plan)
        self.namespace.entries_changed(old_parent)
        self.namespace.entries_changed(new_parent)
        if plan.replaced is not None and plan.replaced.inode in self._handles:
            self._keep_orphan(plan.replaced.inode)

    # --- symbolic links and special files ----------------------------------------------------

    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx=None) -> pyfuse3.EntryAttributes:
        """A link is an object whose mode says S_IFLNK and whose body is the target, written
        as a file is (durable before this returns). The target is a path the kernel
        resolves; the daemon never follows it."""
        parent = self.namespace.node(parent_inode)
        self._check_writable_directory(parent)
        self._check_name(name)
        text = os.fsdecode(name)
        if await self._blocking(self.namespace.entry, parent, text) is not None:
            raise pyfuse3.FUSEError(errno.EEXIST)
        with _as_fuse_error():
            self.namespace.check_key(parent, text)
        handle = await self._writer(0, parent.source, parent.key + text, None,
                                    self._creator_attrs(parent, stat.S_IFLNK | 0o777, ctx))
        try:
            with _as_fuse_error():
                self.writeback.wrote(handle.pending, 0, len(target))
                os.pwrite(handle.fd, target, 0)
                self.writeback.appended(handle.pending, 0, len(target))
            await self._blocking(self.writeback.commit, handle.pending, handle.fd)
        finally:
            self._close(handle)
        node = self.namespace.child(parent, Entry(text, self.writeback.info(handle.pending)))
        node.link_target = (self.writeback.info(handle.pending).etag, target)
        self.namespace.entries_changed(parent)
        return self._attributes(node)

    async def readlink(self, inode: int, ctx=None) -> bytes:
        """The link's body: from its local data file while it is pending, else its object
        through the tiers (so the disk tier keeps it across remounts), once per version."""
        node = self.namespace.node(inode)
        info = await self._info_with_attrs(node)
        if info is None or info.attrs is None or info.attrs.file_type != stat.S_IFLNK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if node.link_target is not None and node.link_target[0] == info.etag:
            return node.link_target[1]
        state = self.writeback.get(node.source, node.key) if self.writeback else None
        if state is not None and state.kind == DATA and state.file is not None:
            handle = self._local_handle(inode, state, os.O_RDONLY)
            try:
                with _as_fuse_error():
                    target = os.pread(handle.fd, info.size, 0)
            finally:
                self._close(handle)
        else:
            ref = await self._current_ref(node)
            with _as_fuse_error():
                target = await self.stack.read_async(ref, 0, ref.size,
                                                     self.stack.new_read_ahead(), self._threads)
        node.link_target = (info.etag, target)
        return target

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx=None) -> pyfuse3.EntryAttributes:
        """FIFOs, sockets and device nodes are objects that carry their mode (and a device's
        number) and nothing else; the kernel serves them itself once they are looked up. A
        regular file made this way is an empty file."""
        parent = self.namespace.node(parent_inode)
        self._check_writable_directory(parent)
        self._check_name(name)
        attrs = self._creator_attrs(parent, mode, ctx)
        if attrs.file_type is None:
            fi, attributes = await self.create(parent_inode, name, mode,
                                               os.O_CREAT | os.O_EXCL | os.O_WRONLY, ctx)
            await self.release(fi.fh)
            return attributes
        if attrs.file_type not in SPECIAL_TYPES:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if attrs.file_type in (stat.S_IFCHR, stat.S_IFBLK):
            attrs = replace(attrs, rdev=rdev)
        node = await self._blocking(self.namespace.make_special, parent, os.fsdecode(name),
                                    attrs)
        self.namespace.entries_changed(parent)
        return self._attributes(node)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx=None) -> pyfuse3.EntryAttributes:
        """Objects have one name each: a second name would be a second object, which a write
        through one name would not change."""
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx=None) -> None:
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    async def removexattr(self, inode: int, name: bytes, ctx=None) -> None:
        raise pyfuse3.FUSEError(errno.ENOTSUP)
