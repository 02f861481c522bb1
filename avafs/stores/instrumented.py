"""An ObjectStore wrapper that counts and times every request into the daemon's metrics, and
keeps whether the store answers (`unreachable_since`, for lookups, the status and metrics).

It wraps every store a mount uses, so it is also where the source's reserved snapshot prefix
(`SNAPSHOTS_PREFIX`) is left out of the root's listing: no mount shows it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import BinaryIO, TypeVar

from ..errors import ObjectChangedError, StoreError
from ..metrics import Metrics
from .base import (
    SNAPSHOTS_PREFIX,
    Listing,
    MultipartUploads,
    ObjectInfo,
    ObjectStore,
    Part,
)
from .metadata import Attrs

T = TypeVar("T")


class InstrumentedStore(ObjectStore, MultipartUploads):
    def __init__(self, inner: ObjectStore, metrics: Metrics) -> None:
        self.inner = inner
        self.url = inner.url
        self._parts = inner.multipart()
        self._metrics = metrics
        metrics.store_unreachable.labels(self.url).set_function(
            lambda: float(self.unreachable_since is not None))

    def _timed(self, operation: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            result = call()
        except Exception as error:
            self._record(operation, started, error)
            raise
        self._record(operation, started)
        return result

    def _record(self, operation: str, started: float, error: Exception | None = None) -> None:
        self._metrics.store_requests.labels(operation).inc()
        self._metrics.store_latency.labels(operation).observe(time.perf_counter() - started)
        if error is not None:
            self._metrics.store_errors.labels(operation).inc()
        if error is None or isinstance(error, ObjectChangedError) or \
                (isinstance(error, StoreError) and error.permanent):
            self.unreachable_since = self.last_error = None
        elif isinstance(error, StoreError) and self.unreachable_since is None:
            self.unreachable_since = time.monotonic()
            self.last_error = str(error)

    def keeps_owners(self) -> bool:
        return self.inner.keeps_owners()

    def key_fits(self, key: str) -> bool:
        return self.inner.key_fits(key)

    def check(self) -> None:
        self.inner.check()

    def list_dir(self, prefix: str) -> Listing:
        listing = self._timed("list", lambda: self.inner.list_dir(prefix))
        if prefix or SNAPSHOTS_PREFIX not in listing.prefixes:
            return listing
        return Listing([found for found in listing.prefixes if found != SNAPSHOTS_PREFIX],
                       listing.objects)

    def walk_versions(self, prefix: str) -> Iterator[tuple[ObjectInfo, str | None]]:
        return iter(self._timed("list", lambda: list(self.inner.walk_versions(prefix))))

    def get_version_range(self, key: str, start: int, length: int, version_id: str) -> bytes:
        return self._timed("get", lambda: self.inner.get_version_range(key, start, length,
                                                                       version_id))

    def head(self, key: str) -> ObjectInfo | None:
        return self._timed("head", lambda: self.inner.head(key))

    def head_quickly(self, key: str) -> ObjectInfo | None:
        return self._timed("head", lambda: self.inner.head_quickly(key))

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        return self._timed("get", lambda: self.inner.get_range(key, start, length, etag))

    async def get_range_async(self, key: str, start: int, length: int, etag: str,
                              threads: Executor) -> bytes:
        started = time.perf_counter()
        try:
            result = await self.inner.get_range_async(key, start, length, etag, threads)
        except Exception as error:
            self._record("get", started, error)
            raise
        self._record("get", started)
        return result

    async def get_described_async(self, listed: ObjectInfo, threads: Executor
                                  ) -> tuple[bytes, ObjectInfo]:
        started = time.perf_counter()
        try:
            result = await self.inner.get_described_async(listed, threads)
        except Exception as error:
            self._record("get", started, error)
            raise
        self._record("get", started)
        return result

    async def close_on_loop(self) -> None:
        await self.inner.close_on_loop()

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        return self._timed("get", lambda: self.inner.open_range(key, start, length, etag))

    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
        return self._timed("put", lambda: self.inner.put(key, body, size, mtime, attrs))

    def delete(self, key: str) -> None:
        self._timed("delete", lambda: self.inner.delete(key))

    def copy(self, source_key: str, key: str, etag: str, mtime: float | None = None,
             attrs: Attrs | None = None) -> ObjectInfo:
        return self._timed("copy", lambda: self.inner.copy(source_key, key, etag, mtime, attrs))

    def multipart(self) -> MultipartUploads | None:
        return self if self._parts is not None else None

    def start_upload(self, key: str, mtime: float | None = None,
                     attrs: Attrs | None = None) -> str:
        return self._timed("start_upload", lambda: self._parts.start_upload(key, mtime, attrs))

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> Part:
        return self._timed("upload_part",
                           lambda: self._parts.upload_part(key, upload_id, number, data))

    def complete_upload(self, key: str, upload_id: str, parts: list[Part],
                        size: int) -> ObjectInfo:
        return self._timed("complete_upload",
                           lambda: self._parts.complete_upload(key, upload_id, parts, size))

    def abort_upload(self, key: str, upload_id: str) -> None:
        self._timed("abort_upload", lambda: self._parts.abort_upload(key, upload_id))

    def uploads_of(self, key: str) -> list[tuple[str, float]]:
        return self._timed("list_uploads", lambda: self._parts.uploads_of(key))
