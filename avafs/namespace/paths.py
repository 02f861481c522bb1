"""Paths for the control plane (`avafs refresh`, warmup, batched reads): a path relative to the
mount resolved to (source, key) without creating inodes; a part of Namespace (__init__.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..stores.base import ObjectInfo
from .listings import CachedListing
from .nodes import ROOT_INODE


class PathLookups:
    def refresh(self, relative: str) -> list[tuple[int, str]]:
        """Forget what is cached about `relative` and everything under it (`avafs refresh`):
        the listings of the directory, of its sub-directories and of its parent (where a new
        object at that path would appear), and the attributes of its nodes, so the next look
        asks the store. Returns the (parent inode, name) of every entry the kernel may have
        cached at or under the path, the path itself included even if it was never found,
        so the caller can have the kernel forget them too. Works on names only: no I/O."""
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        if not self.single_source and not parts:
            sources = set(self.stores)
            prefix = ""
        else:
            sources = {"" if self.single_source else parts[0]}
            inside = parts if self.single_source else parts[1:]
            prefix = "".join(f"{part}/" for part in inside)
        parent = prefix[:prefix.rstrip("/").rfind("/") + 1] if prefix else ""
        with self._lock:
            for slot in [slot for slot in self._listings if slot[0] in sources
                         and (slot[1].startswith(prefix) or slot[1] == parent)]:
                del self._listings[slot]
            entries = []
            for node in self._nodes.values():
                if node.inode != ROOT_INODE and node.source in sources and (
                        node.key.startswith(prefix) or node.key == prefix.rstrip("/")):
                    node.checked_at = -math.inf
                    entries.append((node.parent, node.name))
            inode = ROOT_INODE
            for part in parts[:-1]:
                inode = self._children.get((inode, part), 0)
            if parts and inode:
                entries.append((inode, parts[-1]))
        return entries

    def resolve(self, relative: str, listings: dict[tuple[str, str], CachedListing] | None = None
                ) -> tuple[str, str, ObjectInfo | None]:
        """(source, key, info) of a file or (source, prefix, None) of a directory, by its path
        relative to the mount; raises FileNotFoundError. Creates no inodes.

        `listings` keeps the directories looked up for a batch of paths, so a batch of
        samples from one directory merges that directory's pending writes once, not once per
        path (the batched reads' largest cost)."""
        parts = [part for part in relative.split("/") if part not in ("", ".")]
        source, prefix = "", ""
        if not self.single_source:
            if not parts:
                raise IsADirectoryError("the namespace root spans every source; name one")
            source = parts.pop(0)
            if source not in self.stores:
                raise FileNotFoundError(relative)
        for position, part in enumerate(parts):
            if listings is None:
                listing = self.listing(source, prefix)
            elif (listing := listings.get((source, prefix))) is None:
                listing = listings[(source, prefix)] = self.listing(source, prefix)
            entry = listing.entries.get(part)
            if entry is None:
                raise FileNotFoundError(relative)
            if entry.info is not None:
                if position != len(parts) - 1:
                    raise FileNotFoundError(relative)
                return source, entry.info.key, entry.info
            prefix = f"{prefix}{part}/"
        return source, prefix, None

    def files_under(self, relative: str) -> list[str]:
        """Paths, relative to the mount, of every file under a directory: what a recursive
        readdir of it through the mount finds, without a FUSE request per entry."""
        try:
            source, prefix, info = self.resolve(relative)
        except IsADirectoryError:  # the root of a mount of several sources
            return [path for source in sorted(self.stores) for path in self.files_under(source)]
        if info is not None:
            raise NotADirectoryError(relative)
        root = "" if self.single_source else f"{source}/"
        return [f"{root}{found.key}" for found in self.walk(source, prefix)]

    def walk(self, source: str, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under a directory, depth first, in name order."""
        for entry in self.listing(source, prefix).ordered:
            if entry.info is not None:
                yield entry.info
            else:
                yield from self.walk(source, f"{prefix}{entry.name}/")

    def path_of_url(self, url: str) -> str:
        """The mount-relative path of `s3://bucket/key` (or file://) inside this namespace."""
        for name, store in self.stores.items():
            root = store.url.rstrip("/") + "/"
            if url.startswith(root):
                return f"{name}/{url[len(root):]}".lstrip("/")
        raise FileNotFoundError(f"{url} is in none of this mount's sources")
