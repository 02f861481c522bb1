"""The vocabulary every layer shares: an object version as a reader opened it, what a cached
block of it is called, which blocks a byte range touches, the directory a key lives in, and
what a local file of some length takes on disk (counted alike by the disk tier's cap and by
write-back's dirty bytes, which share one disk)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

from .stores.base import ObjectStore

_ALLOCATION_UNIT = 4096


class BlockId(NamedTuple):
    """A block of one version of one object: a new ETag means new blocks, never stale ones."""

    source: str
    key: str
    etag: str
    index: int

    def encode(self) -> str:
        return f"{self.source}\0{self.key}\0{self.etag}\0{self.index}"

    @classmethod
    def decode(cls, text: str) -> BlockId:
        source, key, etag, index = text.split("\0")
        return cls(source, key, etag, int(index))

    def file_name(self) -> str:
        return hashlib.sha256(self.encode().encode()).hexdigest()[:40]


def block_span(offset: int, size: int, object_size: int, block_size: int) -> range:
    """Indices of the blocks holding [offset, offset+size) of an object."""
    end = min(offset + size, object_size)
    if end <= offset:
        return range(0)
    return range(offset // block_size, (end - 1) // block_size + 1)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One version of one object, as a reader opened it."""

    source: str
    store: ObjectStore
    key: str
    etag: str
    size: int

    def block(self, index: int) -> BlockId:
        return BlockId(self.source, self.key, self.etag, index)


def parent_prefix(key: str) -> str:
    return key[:key.rfind("/", 0, len(key) - 1) + 1]


def allocated(size: int) -> int:
    """Bytes a file of `size` occupies on disk, so the caps match what `du` reports."""
    return -(-size // _ALLOCATION_UNIT) * _ALLOCATION_UNIT
