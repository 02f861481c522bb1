"""The namespace changes of a writable mount (mkdir, rmdir, rename, special files), checked as
POSIX has them and planned here, so the FUSE handlers only translate requests and answers;
a part of Namespace (__init__.py)."""

from __future__ import annotations

import dataclasses
import errno
from dataclasses import dataclass

from ..stores.base import ObjectInfo
from ..stores.metadata import Attrs
from .listings import CachedListing
from .nodes import Entry, Node, Refused


@dataclass(slots=True)
class RenamePlan:
    """A rename checked and planned (its directories listed), not yet made."""

    source: str
    old_parent: Node
    old_name: str
    new_parent: Node
    new_name: str
    old_key: str
    new_key: str
    """The renamed file's key, or the renamed directory's prefix, before and after."""
    is_dir: bool
    moves: list[tuple[str, str, Entry]]
    """(old key, new key, entry as listed) of every file that moves."""
    markers: list[tuple[str, str]]
    """(old prefix, new prefix) of every directory that moves."""
    renamed: Node | None
    """The node of the renamed file or directory, if the kernel has one."""
    replaced: Node | None
    """The node of what the rename replaces (a file, or an empty directory), if any."""

    def takes_key_of(self, node: Node) -> bool:
        """Whether the rename takes the node's key away from it: the renamed file's node, or
        any node under the renamed directory (their readers may need a local copy first)."""
        if self.is_dir:
            return node.source == self.source and node.key.startswith(self.old_key)
        return node is self.renamed


class Changes:
    def mkdir(self, parent: Node, name: str, attrs: Attrs) -> Node:
        """A new directory with these attributes (blocks while its marker is journaled);
        Refused if the name is taken. Counts one kernel lookup of its node."""
        if self.entry(parent, name) is not None:
            raise Refused(errno.EEXIST, f"{parent.key}{name} exists")
        prefix = f"{parent.key}{name}/"
        self._check_key(parent.source, prefix)
        self.writeback.make_empty(parent.source, prefix, attrs)
        with self._lock:
            if (parent.source, parent.key) in self._listings:
                # The store's listing of the parent showed nothing of this name, so the store
                # holds nothing under it: its listing is known, empty, without asking. Files
                # written in it then show from it as they upload (`settled`), and a store
                # whose listings are slow neither hides them nor makes a readdir wait.
                self._listings[(parent.source, prefix)] = CachedListing(self._clock())
        return self.child(parent, Entry(name, None))

    def make_special(self, parent: Node, name: str, attrs: Attrs) -> Node:
        """A new FIFO, socket or device node (`attrs.file_type`), as mkdir makes a directory."""
        if self.entry(parent, name) is not None:
            raise Refused(errno.EEXIST, f"{parent.key}{name} exists")
        key = parent.key + name
        self._check_key(parent.source, key)
        self.writeback.make_empty(parent.source, key, attrs)
        return self.child(parent, Entry(name, self.writeback.info(
            self.writeback.get(parent.source, key))))

    def _check_key(self, source: str, key: str) -> None:
        """Refuses a name whose key the store cannot hold, before anything is journaled."""
        if not self.stores[source].key_fits(key):
            raise Refused(errno.ENAMETOOLONG, f"{key!r} is too long for "
                          f"{self.stores[source].url}")

    def check_key(self, parent: Node, name: str) -> None:
        """`_check_key` for a file about to be created as `name` in `parent`."""
        self._check_key(parent.source, parent.key + name)

    def rmdir(self, parent: Node, name: str) -> None:
        """Remove an empty directory (blocks while it is listed and journaled)."""
        entry = self.entry(parent, name)
        if entry is None:
            raise Refused(errno.ENOENT, f"{parent.key}{name} does not exist")
        if not entry.is_dir:
            raise Refused(errno.ENOTDIR, f"{parent.key}{name} is a file")
        prefix = f"{parent.key}{name}/"
        if self.listing(parent.source, prefix).entries:
            raise Refused(errno.ENOTEMPTY, f"{prefix} is not empty")
        self.writeback.rmdir(parent.source, prefix)

    def plan_rename(self, old_parent: Node, old_name: str, new_parent: Node, new_name: str,
                    replace: bool) -> RenamePlan:
        """Check a rename within one source as POSIX does (Refused with its errno) and plan it;
        lists a renamed directory's whole subtree (blocks). `replace`: an existing target may
        be replaced (no RENAME_NOREPLACE)."""
        entry = self.entry(old_parent, old_name)
        if entry is None:
            raise Refused(errno.ENOENT, f"{old_parent.key}{old_name} does not exist")
        target = self.entry(new_parent, new_name)
        if target is not None and not replace:
            raise Refused(errno.EEXIST, f"{new_parent.key}{new_name} exists")
        source = old_parent.source
        self._check_key(new_parent.source, new_parent.key + new_name + ("/" if entry.is_dir
                                                                          else ""))
        if entry.is_dir:
            old_key, new_key = f"{old_parent.key}{old_name}/", f"{new_parent.key}{new_name}/"
            if new_key.startswith(old_key):
                raise Refused(errno.EINVAL, f"cannot move {old_key} into itself")
            if target is not None and not target.is_dir:
                raise Refused(errno.ENOTDIR, f"{new_key} is a file")
            if target is not None and self.listing(source, new_key).entries:
                raise Refused(errno.ENOTEMPTY, f"{new_key} is not empty")
            moves, markers = self._directory_moves(source, old_key, new_key)
            for _, moved, _ in moves:
                self._check_key(source, moved)
        else:
            old_key, new_key = old_parent.key + old_name, new_parent.key + new_name
            if target is not None and target.is_dir:
                raise Refused(errno.EISDIR, f"{new_key} is a directory")
            moves, markers = [(old_key, new_key, entry)], []
        return RenamePlan(source, old_parent, old_name, new_parent, new_name, old_key, new_key,
                          entry.is_dir, moves, markers, self.node_of(old_parent, old_name),
                          self.node_of(new_parent, new_name) if target is not None else None)

    def _directory_moves(self, source: str, old_prefix: str, new_prefix: str
                         ) -> tuple[list[tuple[str, str, Entry]], list[tuple[str, str]]]:
        """Every file and directory under `old_prefix`, as listed now, with its new key; the
        listings are kept under their new prefixes (`_prepare_move`)."""
        moves, markers = [], [(old_prefix, new_prefix)]
        pending_dirs, listings = [old_prefix], {}
        while pending_dirs:
            prefix = pending_dirs.pop()
            listings[prefix] = self.listing(source, prefix)
            for entry in listings[prefix].ordered:
                if entry.is_dir:
                    sub = f"{prefix}{entry.name}/"
                    markers.append((sub, new_prefix + sub[len(old_prefix):]))
                    pending_dirs.append(sub)
                else:
                    key = prefix + entry.name
                    moves.append((key, new_prefix + key[len(old_prefix):], entry))
        self._prepare_move(source, listings, old_prefix, new_prefix)
        return moves, markers

    def rename(self, plan: RenamePlan) -> None:
        """Make a planned rename: write-back journals it as one batch (blocks until it is
        durable), then the nodes answer for their new keys and the replaced one for none. A
        moved file with no pending state is clean; its info is looked up as the rename is
        applied (an upload settling after the file was listed makes it clean, with the info
        the listing has now)."""
        source = plan.source
        listed = {old: entry.info for old, _, entry in plan.moves}

        def clean_info(key: str) -> ObjectInfo | None:
            if key.endswith("/"):
                return self.marker_info(source, key)
            return self.listed_info(source, key) or listed[key]

        self.writeback.rename(source, [(old, new) for old, new, _ in plan.moves], plan.markers,
                              clean_info, plan.old_key)
        if plan.replaced is not None:
            self.detach(plan.replaced)
        node = self.node_of(plan.old_parent, plan.old_name)
        if node is not None:
            self._moved(node, plan.new_parent, plan.new_name, plan.new_key)

    def _prepare_move(self, source: str, listings: dict[str, CachedListing], old_prefix: str,
                      new_prefix: str) -> None:
        """Before a directory rename is journaled: the listings of its directories (as the
        mount shows them, keyed by prefix) under their new prefixes, so an upload settling
        there (possibly before the rename returns) updates what its files show. With no
        listing, a file written there showed its size from before the rename."""
        with self._lock:
            for prefix, listing in listings.items():
                moved = new_prefix + prefix[len(old_prefix):]
                self._listings[(source, moved)] = CachedListing(listing.fetched_at, {
                    name: Entry(name, entry.info and dataclasses.replace(entry.info,
                                                                         key=moved + name))
                    for name, entry in listing.entries.items()})

    def _moved(self, node: Node, new_parent: Node, new_name: str, new_key: str) -> None:
        """The kernel keeps a renamed inode, so the node (and, for a directory, every node
        below it) must answer for its new key from now on."""
        with self._lock:
            self._children.pop((node.parent, node.name), None)
            stale = self._children.get((new_parent.inode, new_name))
            if stale is not None and stale != node.inode:
                del self._children[(new_parent.inode, new_name)]
            old_key = node.key
            node.parent, node.name, node.key = new_parent.inode, new_name, new_key
            self._children[(new_parent.inode, new_name)] = node.inode
            if node.is_dir:
                for other in self._nodes.values():
                    if other is not node and other.source == node.source and \
                            other.key.startswith(old_key):
                        other.key = new_key + other.key[len(old_key):]
