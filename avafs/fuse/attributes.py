"""What `stat` and every entry of a lookup or readdir show: a part of AvafsOperations
(operations.py).

A file's mode, owner, type and times are its object's where its metadata names them, else the
mount's (`--file-mode`, `--uid`, `--gid`); a directory's are its marker's, else `--dir-mode`
and the mount's owner. What a new file is created with is decided here too (`_creator_attrs`).
The state these methods use is AvafsOperations': the namespace and write-back, the mount's
options and owner, the orphans of the open-file table, and `_built`, the attributes cache.
"""

from __future__ import annotations

import asyncio
import stat

import pyfuse3

from ..errors import ObjectChangedError, StoreError
from ..namespace import Node
from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs
from ..writeback.pending import Pending
from . import kernel
from .kernel import drop_pages

_NO_ATTRS = Attrs()
"""What a file whose object names no mode or owner shows: the mount's defaults."""
_LINK_MOST = 4096
"""Bytes a link's object can hold at most: its target, shorter than PATH_MAX. A larger object
is a regular file, whatever its metadata has yet to say; special files' objects are empty."""


def _surely_regular(info: ObjectInfo | None) -> bool:
    """Whether the object is a regular file before its metadata is read."""
    return info is not None and info.size > _LINK_MOST


class AttributeAnswers:
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
            attrs.attr_timeout = 0
            if not _surely_regular(info):
                # Nor the entry: its type may be a link's, and the kernel cannot change an
                # inode's type, only look the name up again and make a new one.
                attrs.entry_timeout = 0
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

    async def _described(self, node: Node, lookup: bool = False,
                         reader: int | None = None) -> pyfuse3.EntryAttributes:
        """The node's attributes, its object's metadata read first where needed (one GET or
        HEAD). Where lookups in one directory go one at a time (`kernel.PARALLEL_LOOKUPS`
        false: the kernel holds the directory's lock through a LOOKUP), a LOOKUP (`lookup`)
        of a file that is surely a regular one answers from the listing, with no timeout on
        the attributes, and leaves that read to the GETATTR the kernel then sends before it
        uses them (a `stat`, the permission check of an `open`), which go side by side: a
        lookup that waited for the store would have every other new name of that directory
        wait with it. With parallel lookups the LOOKUP reads them itself, and the file costs
        no GETATTR. `reader`: the thread that sent the request, whose own run of lookups in
        the directory the read-ahead follows (`DirectoryReadAhead.reached`)."""
        if node.is_dir:
            if self._undescribed_directory(node) and \
                    not self.namespace.marker_from_listing(node):
                await self._blocking(self.namespace.describe_directory, node)
            return self._attributes(node)
        if not self.options.listing_attrs and not (
                lookup and not kernel.PARALLEL_LOOKUPS
                and _surely_regular(self.namespace.current_info(node))):
            await self._info_with_attrs(node, reader)
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
            await drop_pages(node.inode, self._threads)

    async def _info_with_attrs(self, node: Node, reader: int | None = None) -> ObjectInfo | None:
        """The file's info with its attributes: a small file's read from the GET that brings
        its bytes into the tiers, sent from this loop (its first read is then a hit, and the
        lookup costs no request of its own), or by the one fetching it ahead of this lookup
        (read_ahead.py), which each lookup moves on; a larger one's, or where that GET cannot
        be sent now, with a HEAD in a thread (`Namespace.describe`)."""
        info = self.namespace.current_info(node)
        if info is None:
            return info
        self._read_ahead.reached(node, reader)
        if info.attrs is not None or self.namespace.describe_paused():
            return info
        if info.size > 0:
            fetching = self._read_ahead.fetching(node.source, info.key)
            if fetching is not None:
                await asyncio.shield(fetching)
                info = self.namespace.current_info(node)
                if info is None or info.attrs is not None:
                    return info  # what it learned is the listing's entry now
            try:
                found = await self.stack.fetch_described(
                    info, self.namespace.object_ref(node.source, info))
            except ObjectChangedError:
                found = None  # replaced since it was listed: the HEAD tells what it is now
            except StoreError as error:
                self.namespace.pause_describing(node, error)
                return info
            if found is not None:
                return self.namespace.described(node, info, found)
        return await self._blocking(self.namespace.describe, node)

    def _negative_entry(self) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = 0
        attrs.entry_timeout = self._timeout
        return attrs

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
