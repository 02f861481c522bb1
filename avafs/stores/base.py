"""The ObjectStore interface: the only thing the tiers and the namespace know of a bucket.

It is deliberately small (list one directory level, stat a key, read a byte range) so that a
new backend is a short module, and every backend is exercised by the same mount tests.
Methods block; callers run them in worker threads, never on the FUSE loop, except the two
whose names say they are for the loop (`get_range_async`, `close_on_loop`).
"""

from __future__ import annotations

import asyncio
import io
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import ObjectChangedError, StoreError
from .metadata import Attrs

SNAPSHOTS_PREFIX = ".avafs-snapshots/"
"""The key prefix, at a source's root, under which its snapshots are kept
(`avafs/snapshots/catalog.py`); never shown in a mount of the source (`InstrumentedStore`)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    mtime: float
    """The file's modification time: the object's `mtime` metadata where it has one, else
    the time the store wrote it."""
    attrs: Attrs | None = None
    """Mode and owner from the object's metadata; None where they were not read (a listing
    carries no metadata), and then `mtime` is the store's write time."""


@dataclass(frozen=True, slots=True)
class Listing:
    """One directory level: sub-prefixes (ending in '/') and objects directly under it."""

    prefixes: list[str]
    objects: list[ObjectInfo]


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """How long one request to a networked store may take before it is abandoned (and retried
    by its caller): `timeout` seconds for a request that carries no data (LIST, HEAD, DELETE, a
    small GET), plus the time a transfer of `size` bytes takes at `min_rate` bytes per second.
    Why a bound per byte: a store that accepts connections and never answers must cost a lookup
    seconds, not minutes, while a large part on a slow link must still be allowed to finish."""

    timeout: float = 5.0
    min_rate: int = 2**20

    def for_size(self, size: int) -> float:
        return self.timeout + size / self.min_rate


Part = dict[str, object]
"""What completing a multipart upload needs to know of one uploaded part (opaque to callers)."""


class MultipartUploads(ABC):
    """Uploads sent part by part as the data appears (S3's multipart upload), which lets a file
    go to the store while it is still being written. Parts are numbered from 1; every part but
    the last holds at least 5 MiB."""

    @abstractmethod
    def start_upload(self, key: str, mtime: float | None = None,
                     attrs: Attrs | None = None) -> str:
        """Begin an upload of `key` whose object will carry `mtime` and `attrs` (None: no
        metadata; an mtime of None alone: the upload time stands for it); its upload id."""

    @abstractmethod
    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> Part:
        """Send part `number`; what `complete_upload` needs of it."""

    @abstractmethod
    def complete_upload(self, key: str, upload_id: str, parts: list[Part],
                        size: int) -> ObjectInfo:
        """Make `parts` (in part-number order, `size` bytes in all) the object `key`,
        atomically for readers."""

    @abstractmethod
    def abort_upload(self, key: str, upload_id: str) -> None:
        """Drop the upload and its parts; the object stays as it was. An upload that no
        longer exists (completed or aborted already) is not an error."""

    @abstractmethod
    def uploads_of(self, key: str) -> list[tuple[str, float]]:
        """(upload id, when it was started, in seconds since the epoch by the store's clock)
        of every unfinished upload of exactly `key`."""


class ObjectStore(ABC):
    """A bucket (or a prefix of one); keys are relative to the store's root."""

    url: str
    unreachable_since: float | None = None
    """Since when (time.monotonic) the store has failed every request in a way that may pass
    (timeouts, resets, 5xx), None while it answers; kept by InstrumentedStore, which wraps
    every store a mount uses, so callers can stop waiting for a store known to be down."""
    last_error: str | None = None
    """The message of the failure that made the store unreachable."""

    def multipart(self) -> MultipartUploads | None:
        """Part-by-part uploads, where the store has them; without them a written file is
        uploaded whole after it is closed."""
        return None

    def keeps_owners(self) -> bool:
        """Whether files may get any owner and group (`Attrs.uid`, `Attrs.gid`)."""
        return True

    def key_fits(self, key: str) -> bool:
        """Whether the store can hold an object of this key at all: a key it cannot is
        refused when the file is named (ENAMETOOLONG), not retried as an upload."""
        return True

    @abstractmethod
    def check(self) -> None:
        """Raise AvafsError with a user-facing message if the store cannot be used."""

    @abstractmethod
    def list_dir(self, prefix: str) -> Listing:
        """Every entry directly under `prefix` ('' or ending in '/'), all pages, and the
        directory's own marker object (key `prefix`) where it has one."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object's current metadata, or None if there is no such object."""

    def copied_attributes(self, key: str, etag: str) -> tuple[float, Attrs]:
        """The mtime and attributes that a copy of version `etag` of `key` carries (as `copy`
        without `mtime` gives them), for one who sends the copy's bytes itself. Raises
        ObjectChangedError if the store holds another version or none."""
        found = self.head(key)
        if found is None or found.etag != etag:
            raise ObjectChangedError(f"{self.url}{key} changed before its copy")
        return found.mtime, found.attrs or Attrs()

    def head_quickly(self, key: str) -> ObjectInfo | None:
        """`head` for an answer the caller can do without (a file's attributes on its first
        stat): few retries and short timeouts where the store has them, so a store that is
        down costs a lookup about a second, not a minute."""
        return self.head(key)

    @abstractmethod
    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        """`length` bytes from `start` of the version `etag`.

        Raises ObjectChangedError if the object is no longer that version.
        """

    async def get_range_async(self, key: str, start: int, length: int, etag: str,
                              threads: Executor) -> bytes:
        """`get_range` for a caller on an asyncio loop, which it never blocks: in one of
        `threads`, unless the store can send the request from the loop itself."""
        return await asyncio.wrap_future(threads.submit(self.get_range, key, start, length,
                                                        etag))

    async def get_described_async(self, listed: ObjectInfo, threads: Executor
                                  ) -> tuple[bytes, ObjectInfo]:
        """The whole object a listing showed as `listed` (its version, `listed.etag`) and
        that version's info with its attributes, in one request sent from the caller's loop:
        the GET a small file's first read needs anyway also answers its first `stat`, which
        would otherwise cost a HEAD of its own. Raises ObjectChangedError if the object is no
        longer that version, StoreError if a request failed. Here, for a store whose reads
        carry no metadata: `head_quickly` and `get_range`, in one of `threads`."""
        def head_and_get() -> tuple[bytes, ObjectInfo]:
            found = self.head_quickly(listed.key)
            if found is None or found.etag != listed.etag:
                raise ObjectChangedError(f"{self.url}{listed.key} changed since it was listed")
            return self.get_range(listed.key, 0, listed.size, listed.etag), found

        return await asyncio.wrap_future(threads.submit(head_and_get))

    async def close_on_loop(self) -> None:
        """Release what `get_range_async` opened on the loop; called on that loop, as it
        ends. A store that sends nothing from the loop has nothing to release."""
        return

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        """A stream of `length` bytes from `start` of version `etag`, for sequential readers:
        one request for many blocks. Backends that can stream override this."""
        return io.BytesIO(self.get_range(key, start, length, etag))

    def walk_versions(self, prefix: str) -> Iterator[tuple[ObjectInfo, str | None]]:
        """Every object under `prefix` ('' or ending in '/'), at every depth, with the id of
        its current version where the store keeps versions (else None): what a snapshot
        records. Directory markers are left out. This default walks `list_dir` level by
        level; a store that lists a whole prefix in one paginated request overrides it."""
        listing = self.list_dir(prefix)
        for info in listing.objects:
            if not info.key.endswith("/"):
                yield info, None
        for below in listing.prefixes:
            yield from self.walk_versions(below)

    def get_version_range(self, key: str, start: int, length: int, version_id: str) -> bytes:
        """`length` bytes from `start` of the version `version_id` of `key`, which a store
        that keeps versions serves after the key changed or was deleted.

        Raises ObjectChangedError if the store no longer has that version."""
        raise StoreError(f"{self.url} keeps no versions: cannot read version {version_id} of "
                         f"{key!r}", permanent=True)

    @abstractmethod
    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
        """Store `size` bytes read from `body` as `key`, atomically for readers: they see the
        old object or the whole new one. An exception raised by `body.read` aborts the upload
        and leaves the old object. A key ending in '/' is a directory marker. With `mtime`,
        the object keeps it and `attrs` (metadata.py) as the file's attributes."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key`; removing a missing key is not an error."""

    @abstractmethod
    def copy(self, source_key: str, key: str, etag: str, mtime: float | None = None,
             attrs: Attrs | None = None) -> ObjectInfo:
        """Server-side copy of version `etag` of `source_key` to `key`: with the source's
        attributes, or with `mtime` and `attrs` where given. A copy onto itself is how a file's
        attributes change without sending its data again.

        Raises ObjectChangedError if the source is no longer that version.
        """
