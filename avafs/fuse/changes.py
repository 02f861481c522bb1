"""Namespace changes: unlink and rename, and what keeps a file deleted or renamed over while
open alive for its open handles; a part of AvafsOperations (operations.py), whose open-file
table (`_open`, `_handles`, `_orphans`) these methods keep.

A file deleted or renamed over while open lives on for its open handles, as on a local file
system: written data stays in its local data file (the write-back state the handles hold, no
longer any key's), a clean version being read is first copied to one, and the inode answers from
that state (`_orphans`) until its last close frees it. Nothing of it is uploaded.
"""

from __future__ import annotations

import errno
import logging
import os
import time

import pyfuse3

from ..namespace import Entry, Node
from ..writeback.pending import Pending

log = logging.getLogger(__name__)


class NamespaceChanges:
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
