"""Where a dataset's items come from: every file under a directory, or the lines of a manifest.

Listing is lazy and cached: constructing a source touches at most its root, so building a dataset
over millions of objects is instant, and the one listing that happens is reused by every epoch
and (through pickling) by every DataLoader worker forked after it. A directory inside an avafs
mount is listed by its daemon in one request; elsewhere walks use `os.scandir`, whose entries
carry the file type from readdir, so the walk lists but never stats.
"""

from __future__ import annotations

import hashlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.errors import EmptyDatasetError, ManifestError
from adapters.mounts import client_for
from avafs.reader.manifest import read_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Item:
    """One unit a dataset reads: a sample file, or a shard file holding many samples."""

    path: str
    """Absolute local path, inside a mount or a plain directory."""
    key: str
    """Stable name relative to the source's root; the sample's `__key__`."""
    labels: Mapping[str, Any] = field(default_factory=dict)


class ItemSource(ABC):
    """A lazily listed, cached, ordered sequence of items sharing one root directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self._items: list[Item] | None = None
        self._fingerprint: str | None = None

    def items(self) -> Sequence[Item]:
        if self._items is None:
            items = self._list()
            if not items:
                raise EmptyDatasetError(f"{self.describe()} has no samples")
            self._items = items
        return self._items

    def fingerprint(self) -> str:
        """Identifies the exact listing, so workers that list differently are caught, not mixed."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for item in self.items():
                digest.update(item.key.encode())
                digest.update(b"\0")
            self._fingerprint = f"{len(self.items())}-{digest.hexdigest()[:16]}"
        return self._fingerprint

    @abstractmethod
    def describe(self) -> str:
        """Names the source in error messages."""

    @abstractmethod
    def _list(self) -> list[Item]:
        """The one expensive listing, called at most once per source object."""


class PrefixSource(ItemSource):
    """Every regular file under a directory, in sorted path order, optionally by suffix."""

    def __init__(self, root: str | os.PathLike[str], suffixes: Sequence[str] = ()) -> None:
        super().__init__(root)
        if not self.root.is_dir():
            from avafs.client import NEW_OBJECTS_HINT

            raise NotADirectoryError(f"{self.root}: not a directory (in an avafs mount, "
                                     f"{NEW_OBJECTS_HINT})")
        self.suffixes = tuple(suffixes)

    def describe(self) -> str:
        wanted = f" ending in {', '.join(self.suffixes)}" if self.suffixes else ""
        return f"directory {self.root} (files{wanted})"

    def _list(self) -> list[Item]:
        root = str(self.root)
        listed = self._listed_by_mount()
        paths = [path for path in (self._walk() if listed is None else listed)
                 if not self.suffixes or path.endswith(self.suffixes)]
        paths.sort()
        skip = len(root) + 1
        return [Item(path=path, key=path[skip:]) for path in paths]

    def _listed_by_mount(self) -> list[str] | None:
        """The files under an avafs mount's directory from its daemon, in one request: a walk
        through FUSE costs the daemon a reply per entry, and every DataLoader worker lists
        again each epoch. None where no daemon answers (a pod sees the mount, not its socket)."""
        from avafs.client import AvafsError

        client = client_for(self.root, require_mount=False)
        if client is None:
            return None
        try:
            return client.list_files(self.root)
        except AvafsError as error:
            log.warning("listing %s through the mount: %s", self.root, error)
            return None

    def _walk(self) -> list[str]:
        paths: list[str] = []
        pending = [str(self.root)]
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    elif entry.is_file():
                        paths.append(entry.path)
        return paths


class ManifestSource(ItemSource):
    """The lines of a JSONL manifest, in file order, labels attached.

    `"path"` entries are relative to `root` (the mount root). `"url"` entries are mapped through
    `url_roots`, e.g. `{"s3://bucket/train": "/mnt/train"}`: the kernel's mount table names every
    avafs mount just "avafs", so which bucket a mount serves must be said, not guessed.
    """

    def __init__(self, manifest: str | os.PathLike[str], root: str | os.PathLike[str],
                 url_roots: Mapping[str, str | os.PathLike[str]] | None = None) -> None:
        super().__init__(root)
        self.manifest = Path(manifest).absolute()
        if not self.manifest.is_file():
            raise FileNotFoundError(f"{self.manifest}: manifest not found")
        self.url_roots = {url.rstrip("/"): str(Path(path).absolute())
                          for url, path in (url_roots or {}).items()}

    def describe(self) -> str:
        return f"manifest {self.manifest}"

    def _list(self) -> list[Item]:
        root = str(self.root)
        items = []
        for entry in read_manifest(self.manifest):
            if entry.path is not None:
                items.append(Item(path=os.path.join(root, entry.path), key=entry.path,
                                  labels=entry.labels))
            else:
                assert entry.url is not None
                items.append(Item(path=self._local_path(entry.url, entry.line), key=entry.url,
                                  labels=entry.labels))
        return items

    def _local_path(self, url: str, line: int) -> str:
        for prefix in sorted(self.url_roots, key=len, reverse=True):
            if url == prefix or url.startswith(prefix + "/"):
                return self.url_roots[prefix] + url[len(prefix):]
        raise ManifestError(f"{self.manifest}:{line}: no mount given for {url}; pass "
                            f"url_roots={{'s3://BUCKET': '/path/to/its/mount'}}")
