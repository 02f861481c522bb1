"""Writes: creating, writing, truncating and committing files, and changes of attributes; a
part of AvafsOperations (operations.py), whose open-file table these methods add writers to.

A write goes to the file's local data file, write-back told of it first (so an upload in flight
knows its snapshot is stale); a write or truncate the data file refuses (EFBIG past what the
cache's file system holds, ENOSPC) is rolled back to the length the file really has, so the
journal never records a size the data file lacks.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time

import pyfuse3

from ..namespace import ROOT_INODE, Entry, Node
from ..objects import ObjectRef
from ..stores.metadata import Attrs
from .errors import as_fuse_error
from .handles import OpenFile

log = logging.getLogger(__name__)


class WriteRequests:
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
            with as_fuse_error():
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
            with as_fuse_error():
                if self.writeback.room_to_write():
                    return
            await asyncio.sleep(0.05)

    async def flush(self, fh: int) -> None:
        """Commits what a writer wrote. Readers are opened with FOPEN_NOFLUSH where pyfuse3
        allows it (`READER`); a read-only mount, where nothing is written, answers ENOSYS
        besides, after which the kernel stops sending FLUSH at all, whatever pyfuse3 allows.
        A file read without either takes four round trips: open, read, flush, release."""
        if self.writeback is None:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        handle = self._open[fh]
        if handle.writable:
            await self._blocking(self.writeback.commit, handle.pending, handle.fd)

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.flush(fh)

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
        with as_fuse_error():
            self.namespace.check_key(parent, text)
        handle = await self._writer(0, parent.source, parent.key + text, None,
                                    self._creator_attrs(parent, mode, ctx))
        node = self.namespace.child(parent, Entry(text, self.writeback.info(handle.pending)))
        handle.inode = node.inode
        self.namespace.entries_changed(parent)
        return pyfuse3.FileInfo(fh=self._register(handle)), self._attributes(node)

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
