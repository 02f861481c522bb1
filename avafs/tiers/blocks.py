"""What a cached block is called, and which blocks a byte range touches."""

from __future__ import annotations

import hashlib
from typing import NamedTuple


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
