"""The inode table: the node of every name the kernel knows, by inode and by (parent, name);
a part of Namespace (__init__.py), whose `_lock` guards it.

An inode number comes back only for the name it had in the same directory (`_retired`), and
only once the kernel forgot it, so the kernel's cached copy of a directory and a later lookup
agree on the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..stores.base import ObjectInfo

ROOT_INODE = 1
NAME_MAX = 255
RETIRED_INODES = 100_000
"""Inode numbers of forgotten entries kept for their names (`Namespace.forget`); past it the
oldest are dropped, and those names get new numbers when they are looked up again."""


class Refused(OSError):
    """A change POSIX refuses (the name exists, a directory is not empty, ...): the errno is
    the whole answer, and nothing failed that the log should tell."""


@dataclass(slots=True)
class Entry:
    """A child in a directory listing: a sub-directory (info is None) or an object."""

    name: str
    info: ObjectInfo | None

    @property
    def is_dir(self) -> bool:
        return self.info is None


@dataclass(slots=True)
class Node:
    inode: int
    parent: int
    name: str
    source: str
    key: str
    """The object's key, or for a directory its prefix ('' or ending in '/')."""
    info: ObjectInfo | None
    checked_at: float
    lookups: int = 0
    kernel_cached_etag: str | None = None
    """The version whose pages the kernel may hold, so a re-open can keep them."""
    marker: ObjectInfo | None = None
    """A directory's marker object (`key`, ending in '/') as the store has it, with the
    directory's attributes; None where it has none or it was not read (`marker_read_at`)."""
    marker_read_at: float = -math.inf
    entries_changed_at: float | None = None
    """When this mount last created, removed or renamed an entry of the directory: its mtime
    and ctime from then on, in memory only (a marker written per new file would cost a
    request each)."""
    link_target: tuple[str, bytes] | None = None
    """A symbolic link's (etag, target), read once per version."""

    @property
    def is_dir(self) -> bool:
        return self.info is None


def valid_name(name: str) -> bool:
    return (name not in ("", ".", "..") and "\0" not in name
            and len(name.encode("utf-8", "surrogateescape")) <= NAME_MAX)


def richer(listed: ObjectInfo, known: ObjectInfo | None) -> ObjectInfo:
    """A listing's entry, or what is known of the same version with its attributes read: a
    listing carries no metadata, so listing a directory again must not forget them."""
    if known is not None and known.attrs is not None and listed.attrs is None and \
            known.etag == listed.etag and known.key == listed.key:
        return known
    return listed


class InodeTable:
    def node(self, inode: int) -> Node:
        return self._nodes[inode]

    def child(self, parent: Node, entry: Entry) -> Node:
        """The node for a listed entry, created on first sight; counts one kernel lookup."""
        with self._lock:
            inode = self._children.get((parent.inode, entry.name))
            node = self._nodes.get(inode) if inode else None
            if node is None or (node.info is None) != (entry.info is None):
                node = self._new_node(parent, entry)
            elif entry.info is not None and node.info is not entry.info and \
                    node.info != entry.info:
                node.info = richer(entry.info, node.info)
            node.checked_at = self._clock()
            node.lookups += 1
            return node

    def _new_node(self, parent: Node, entry: Entry) -> Node:
        retired = self._retired.pop((parent.inode, entry.name), None)
        if retired is not None and retired[1] == entry.is_dir and retired[0] not in self._nodes:
            inode = retired[0]
        else:
            inode = self._next_inode
            self._next_inode += 1
        if parent.inode == ROOT_INODE and not self.single_source:
            source, key = entry.name, ""
        else:
            source = parent.source
            key = entry.info.key if entry.info else f"{parent.key}{entry.name}/"
        node = Node(inode, parent.inode, entry.name, source, key, entry.info, self._clock())
        self._nodes[inode] = node
        self._children[(parent.inode, entry.name)] = inode
        return node

    def node_of(self, parent: Node, name: str) -> Node | None:
        inode = self._children.get((parent.inode, name))
        return self._nodes.get(inode) if inode else None

    def detach(self, node: Node) -> None:
        """The file was deleted or renamed over: its name now names a new inode, not this one,
        which lives on (if open) until the kernel forgets it."""
        with self._lock:
            if self._children.get((node.parent, node.name)) == node.inode:
                del self._children[(node.parent, node.name)]

    def forget(self, inode: int, count: int) -> bool:
        """Takes back `count` kernel lookups; whether the inode is gone now, so whatever a
        caller keeps per inode can go with it. An inode number comes back only for the name
        it had in the same directory (`_retired`), and only once the kernel forgot it: the
        kernel's cached listing of the directory may name the entry with it, and a lookup
        that gave the name a new number would contradict that listing. A name deleted or
        renamed over (`detach`) gives its number to no one."""
        with self._lock:
            node = self._nodes.get(inode)
            if node is None or inode == ROOT_INODE:
                return node is None
            node.lookups -= count
            if node.lookups <= 0:
                del self._nodes[inode]
                if self._children.get((node.parent, node.name)) == inode:
                    del self._children[(node.parent, node.name)]
                    self._retired[(node.parent, node.name)] = (inode, node.is_dir)
                    if len(self._retired) > RETIRED_INODES:
                        del self._retired[next(iter(self._retired))]
                return True
            return False

    def _node_named(self, source: str, key: str) -> Node | None:
        """The node the kernel reaches by the path of `key`, if it has one (call with the lock
        held): found through the names, as nodes are indexed by their parent, not by key."""
        inode: int | None = ROOT_INODE
        for part in ([] if self.single_source else [source]) + key.rstrip("/").split("/"):
            inode = self._children.get((inode, part))
            if inode is None:
                return None
        node = self._nodes.get(inode)
        return node if node is not None and node.key == key else None
