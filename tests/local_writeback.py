"""The write side of a mount without FUSE: a `Namespace` over a `WriteBack` over a `LocalStore`
in a directory, driven through the calls the FUSE operations make, so the tests of their
bookkeeping need neither a mount nor root."""

from __future__ import annotations

import os
from pathlib import Path

from avafs.metrics import Metrics
from avafs.namespace import ROOT_INODE, Namespace, Node
from avafs.objects import ObjectRef
from avafs.stores.base import ObjectStore
from avafs.stores.local import LocalStore
from avafs.tiers.disk import DiskTier
from avafs.writeback.manager import WriteBack
from avafs.writeback.uploader import Uploader

MiB = 2**20


def read_from_store(ref: ObjectRef, offset: int, size: int) -> bytes:
    """Copy-in straight from the store: write-back needs no tiers to work."""
    return ref.store.get_range(ref.key, offset, size, ref.etag)


class LocalWriteSide:
    """One mount's write side, made again over the same directories by `restart` (as a new
    daemon after a crash: nothing is uploaded or closed first)."""

    def __init__(self, directory: Path, store: ObjectStore | None = None,
                 delay: float = 3600.0, dirty_limit: int = 64 * MiB,
                 disk_capacity: int = 256 * MiB) -> None:
        self.directory = directory
        self.bucket = directory / "bucket"
        self.bucket.mkdir(exist_ok=True)
        self.store = store or LocalStore(self.bucket)
        self.delay = delay
        self.dirty_limit = dirty_limit
        self.disk = DiskTier(directory / "disk", disk_capacity, 10_000, 0.9, 0.7)
        self.writeback = self._writeback()
        self.namespace = Namespace({"": self.store}, ttl=60.0, writeback=self.writeback)
        self.writeback.on_settled = self.namespace.settled
        self.uploader: Uploader | None = None

    def _writeback(self) -> WriteBack:
        return WriteBack(self.directory / "writeback", read_from_store, self.disk, Metrics(),
                         self.dirty_limit, sync_uploads=False, delay=self.delay)

    @property
    def root(self) -> Node:
        return self.namespace.node(ROOT_INODE)

    def directory_node(self, path: str) -> Node:
        node = self.root
        for part in filter(None, path.split("/")):
            found = self.namespace.lookup(node, part)
            assert found is not None and found.is_dir, path
            node = found
        return node

    def write(self, path: str, data: bytes, truncate: bool = True) -> None:
        """What open(O_TRUNC or not), write, close do: the key's data file is written and
        committed, as the FUSE write and flush handlers do."""
        parent, _, name = path.rpartition("/")
        node = self.directory_node(parent)
        base = None
        if not truncate:
            info = self.namespace.entry(node, name)
            base = self.namespace.object_ref("", info.info) if info and info.info else None
        pending = self.writeback.open_writer("", node.key + name, base, truncate or base is None)
        assert self.writeback.hold_file(pending.file)
        fd = os.open(self.writeback.data_path(pending), os.O_RDWR)
        try:
            if truncate and pending.size:  # a file still pending is reused, so cut it here
                self.writeback.truncated(pending, 0)
                os.ftruncate(fd, 0)
            start = pending.size
            self.writeback.wrote(pending, start, start + len(data))
            os.pwrite(fd, data, start)
            self.writeback.appended(pending, start, start + len(data))
            self.writeback.commit(pending, fd)
        finally:
            os.close(fd)
            self.writeback.release_writer(pending)
            self.writeback.drop_file(pending.file)

    def read(self, path: str) -> bytes:
        """A file's content as the mount shows it: its pending data, else the store's."""
        parent, _, name = path.rpartition("/")
        entry = self.namespace.entry(self.directory_node(parent), name)
        assert entry is not None and not entry.is_dir, path
        pending = self.writeback.get("", entry.info.key)
        if pending is not None and pending.file:
            return self.writeback.data_path(pending).read_bytes()
        return self.store.get_range(entry.info.key, 0, entry.info.size, entry.info.etag)

    def names(self, path: str = "") -> list[str]:
        node = self.directory_node(path)
        return [entry.name for entry in self.namespace.listing(node.source, node.key).ordered]

    def rename(self, old: str, new: str, replace: bool = True) -> None:
        old_parent, _, old_name = old.rpartition("/")
        new_parent, _, new_name = new.rpartition("/")
        plan = self.namespace.plan_rename(self.directory_node(old_parent), old_name,
                                          self.directory_node(new_parent), new_name, replace)
        self.namespace.rename(plan)

    def unlink(self, path: str) -> None:
        parent, _, name = path.rpartition("/")
        self.writeback.unlink("", self.directory_node(parent).key + name)

    def start_uploads(self) -> None:
        self.uploader = Uploader(self.writeback, {"": self.store}, workers=2)

    def flush(self, timeout: float = 30.0) -> dict:
        if self.uploader is None:
            self.start_uploads()
        return self.writeback.flush(timeout=timeout)

    def restart(self) -> None:
        """A new daemon over the same cache and bucket; the old one's threads just stop."""
        if self.uploader is not None:
            self.uploader.stop()
            self.uploader = None
        self.writeback.close()
        self.writeback = self._writeback()
        self.namespace = Namespace({"": self.store}, ttl=60.0, writeback=self.writeback)
        self.writeback.on_settled = self.namespace.settled

    def close(self) -> None:
        if self.uploader is not None:
            self.uploader.stop()
        self.writeback.close()


def store_files(bucket: Path) -> dict[str, bytes]:
    """Every file in a local bucket, by key (upload temporaries excluded)."""
    return {path.relative_to(bucket).as_posix(): path.read_bytes()
            for path in bucket.rglob("*") if path.is_file()
            and not path.name.startswith(".avafs-upload-")}
