"""Symbolic links and special files (FIFOs, sockets, device nodes); a part of AvafsOperations
(operations.py)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import replace

import pyfuse3

from ..namespace import Entry
from ..stores.metadata import SPECIAL_TYPES
from ..writeback.pending import DATA
from .errors import as_fuse_error


class LinkRequests:
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
        with as_fuse_error():
            self.namespace.check_key(parent, text)
        handle = await self._writer(0, parent.source, parent.key + text, None,
                                    self._creator_attrs(parent, stat.S_IFLNK | 0o777, ctx))
        try:
            with as_fuse_error():
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
                with as_fuse_error():
                    target = os.pread(handle.fd, info.size, 0)
            finally:
                self._close(handle)
        else:
            ref = await self._current_ref(node)
            with as_fuse_error():
                target = bytes(await self.stack.read_async(
                    ref, 0, ref.size, self.stack.new_read_ahead(), self._threads))
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
