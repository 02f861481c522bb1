"""Buckets with known contents, on either backend, for the mount tests."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


def payload(seed: int, size: int) -> bytes:
    """Deterministic, incompressible-looking bytes."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest() * 64
        counter += 1
    return bytes(out[:size])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Bucket:
    """A file:// directory or an S3 bucket, written through the backend's own API."""

    url: str
    mount_args: list[str]
    local_root: Path | None = None
    s3_client: object | None = None
    s3_bucket: str | None = None
    contents: dict[str, bytes] = field(default_factory=dict)

    def put(self, key: str, data: bytes) -> None:
        self.contents[key] = data
        if self.local_root is not None:
            path = self.local_root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        else:
            self.s3_client.put_object(Bucket=self.s3_bucket, Key=key, Body=data)

    def put_many(self, objects: dict[str, bytes]) -> None:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda item: self.put(*item), objects.items()))

    def delete(self, key: str) -> None:
        self.contents.pop(key, None)
        if self.local_root is not None:
            os.unlink(self.local_root / key)
        else:
            self.s3_client.delete_object(Bucket=self.s3_bucket, Key=key)
