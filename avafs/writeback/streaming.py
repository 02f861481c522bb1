"""Upload while writing: a file written front to back goes to the store part by part as it
grows, so it is durable in the store about when its last part is, not one whole upload after
its close.

Why it is safe: a part is read from the local data file only once the writer has gone past its
end, and any later write or truncate below what was handed to parts cancels the stream, after
which the file is uploaded whole after close like any other. Only the uploader completes a
stream, once the file is committed, with the entry's generation unchanged (the check a whole
upload gets).

A crash loses the parts sent, never data: the journaled file is uploaded again by the next
mount, which also aborts the uploads the journal lists as started and not ended, so no parts
are left behind in the bucket; an upload whose id the store gave but the journal never
recorded is found by the intent journaled before it was asked for (`_abort_unrecorded`). For
that every multipart upload of a mount goes through here, journaled before its first part: a
committed file of STREAM_FROM bytes or more that did not stream while written (written out of
order, replayed after a remount) is sent in parts here too (`upload_in_parts`), not by the
store's own managed upload, whose id no journal knows.

What the object carries: its upload is started with the file's mode and owner, and, for a
committed file sent in parts after its close, its mtime; a file streamed while written has no
final mtime yet, so its object shows the upload's completion time instead. Only where the
attributes changed after the upload began, or the mtime was set (utime, touch), does the
uploader copy the object onto itself with them: the copy is a second pass over every byte in
the store, which on some stores takes as long as the upload did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from ..errors import StoreError
from ..stores.base import MultipartUploads, ObjectInfo, ObjectStore, Part
from ..stores.metadata import Attrs
from .journal import Journal
from .pending import DATA, Pending, Stream

log = logging.getLogger(__name__)

STREAM_FROM = 64 * 2**20
"""Files start streaming once this long: below it a file goes up in one PutObject after close
(the same threshold as a whole file's multipart upload)."""
CLOCK_SKEW = 15 * 60.0
"""Seconds the store's clock may differ from this machine's: S3 refuses requests signed more
than 15 minutes off. An upload of a key started later than this after an intent is another
writer's (the create itself ends within its request limits, far sooner)."""
PART_SIZE = 8 * 2**20
PARTS_IN_FLIGHT = 8
"""As many parts in flight as a whole file's managed upload (and the direct upload) uses."""


def part_size(number: int) -> int:
    """Parts double in size every 1000: 8 MiB parts up to 8 GiB, and S3's 10,000 parts
    reach past its 5 TiB object limit though the final size is unknown while writing."""
    return PART_SIZE << ((number - 1) // 1000)


class Completed(NamedTuple):
    """A finished upload: the object as it now is, and whether it carries the mtime and
    attributes its file has (else a copy onto itself must set them)."""

    info: ObjectInfo
    carries_attributes: bool


class StreamCancelled(Exception):
    """The file changed below what was handed to parts; this stream must not complete."""


class StreamUploads:
    """The streams of one mount's written files to their origin; `lock` is the write-back's
    lock, which guards every entry's streams and `appended_to`.

    The target of a stream (which store, under which key, in which of the entry's slots) is
    `_target`, `_stream_of` and `_set_stream`: ClusterStreams (cluster/streams.py) sends the
    same parts to the cluster store's staging object with this machinery. `stores` are the
    stores this instance's journaled uploads may name, by the source the journal gives them;
    each instance aborts only the leftovers of its own stores."""

    def __init__(self, data_dir: Path, stores: dict[str, ObjectStore], lock: threading.RLock,
                 journal: Journal) -> None:
        self._data_dir = data_dir
        self._stores = stores
        self._lock = lock
        self._journal = journal
        self._pool = ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="avafs-part")
        self._active: set[Stream] = set()
        for source, key, upload_id in journal.load_uploads():
            self._pool.submit(self._abort_left_over, source, key, upload_id)
        self._recovering: dict[tuple[str, str], Future[None]] = {
            (source, key): self._pool.submit(self._abort_unrecorded, source, key, intended_at,
                                             before)
            for source, key, intended_at, before in journal.load_intents()}
        """The search for uploads a crash left unrecorded, by key: a new upload of the key
        starts after it (it was queued first, so a part thread waiting for it never waits for
        a thread it holds)."""

    def _abort_left_over(self, source: str, key: str, upload_id: str) -> None:
        """An upload a crash (or a failed abort) left unfinished: its file, if it was
        committed, is uploaded whole from the journal instead."""
        uploads = self._stores[source].multipart() if source in self._stores else None
        if uploads is None:
            return
        try:
            uploads.abort_upload(key, upload_id)
        except Exception as error:  # noqa: BLE001 - retried by the next mount
            log.warning("could not abort the unfinished multipart upload of %s (%s); the next "
                        "mount tries again", key, error)
            return
        self._journal.upload_ended(source, key, upload_id)

    def _abort_unrecorded(self, source: str, key: str, intended_at: float,
                          before: set[str]) -> None:
        """A crash came between journaling the intent to upload `key` and recording the id the
        store gave (or the store never answered): abort the uploads of `key` that the store
        did not have before the intent, did not start more than CLOCK_SKEW after it, and no
        journal record owns; then drop the intent. Which uploads are new is told by their ids,
        not by the store's clock (some S3 servers report a fixed start time). This mount's own
        uploads of the key start after this ends (`_start`)."""
        uploads = self._stores[source].multipart() if source in self._stores else None
        if uploads is None:
            return
        try:
            found = uploads.uploads_of(key)
            owned = {upload_id for _, _, upload_id in self._journal.load_uploads()}
            for upload_id, started in found:
                if upload_id not in owned | before and started <= intended_at + CLOCK_SKEW:
                    uploads.abort_upload(key, upload_id)
                    log.info("aborted the multipart upload of %s a crash left unrecorded", key)
        except Exception as error:  # noqa: BLE001 - retried by the next mount
            log.warning("could not look for a multipart upload of %s a crash left unrecorded "
                        "(%s); the next mount looks again", key, error)
            return
        self._journal.intent_ended(source, key, intended_at)

    def _target(self, entry: Pending) -> tuple[str, str, MultipartUploads] | None:
        """(journal source, key, uploads) a new stream of `entry` goes to; None where it
        cannot stream (called with the lock held)."""
        uploads = self._stores[entry.source].multipart()
        return None if uploads is None else (entry.source, entry.key, uploads)

    def _stream_of(self, entry: Pending) -> Stream | None:
        return entry.stream

    def _set_stream(self, entry: Pending, stream: Stream | None) -> None:
        entry.stream = stream

    def grew(self, entry: Pending) -> None:
        """Hand the parts the writer has gone past to the pool (called with the lock held,
        after each write of a file written front to back)."""
        stream = self._stream_of(entry)
        if stream is None:
            if entry.kind != DATA or not entry.file or entry.appended_to < STREAM_FROM:
                return
            target = self._target(entry)
            if target is None:
                return
            try:
                stream = self._open_stream(entry, target, committed=False)
            except OSError as error:  # the write itself succeeded: upload the file whole later
                log.warning("cannot stream %s while it is written: %s", entry.key, error)
                entry.appended_to = None
                return
        self._send(stream, entry.appended_to, last=False)

    def _open_stream(self, entry: Pending, target: tuple[str, str, MultipartUploads],
                     committed: bool) -> Stream:
        """A new stream of `entry`'s data file to `target`, its upload starting in the pool
        (called with the lock held). Raises OSError if the data file cannot be opened."""
        fd = os.open(self._data_dir / entry.file, os.O_RDONLY)
        source, key, uploads = target
        mtime, attrs = self._metadata(entry, committed)
        stream = Stream(uploads, source, key, fd,
                        self._pool.submit(self._start, uploads, source, key, mtime, attrs),
                        mtime, attrs)
        self._set_stream(entry, stream)
        self._active.add(stream)
        return stream

    def upload_in_parts(self, entry: Pending, generation: int) -> Completed | None:
        """Upload a committed file that has no stream, part by part with its upload
        journaled (in an uploader thread); None where it is too small for parts or the store
        has none, so the caller puts it whole. A write while the parts go up ends the stream
        as it would any other (`finish` then says None). Raises StoreError as `finish`."""
        with self._lock:
            if self._stream_of(entry) is not None or entry.kind != DATA or not entry.file or \
                    entry.size < STREAM_FROM:
                return None
            target = self._target(entry)
            if target is None:
                return None
            self._open_stream(entry, target, committed=True)
            entry.appended_to = None  # a later write ends this stream, it never extends it
        return self.finish(entry, generation)

    def _intend(self, uploads: MultipartUploads, source: str, key: str) -> float:
        """Journal the intent to start an upload of `key`, with the uploads of the key the
        store has already, once the search for leftovers of that key has ended; its time."""
        recovering = self._recovering.get((source, key))
        if recovering is not None:
            wait([recovering])
        before = {upload_id for upload_id, _ in uploads.uploads_of(key)}
        intended_at = time.time()
        self._journal.upload_intended(source, key, intended_at, before)
        return intended_at

    @contextlib.contextmanager
    def intent(self, store: ObjectStore, source: str, key: str, size: int) -> Iterator[None]:
        """Around a request that may start a multipart upload of `key` the store's client
        makes on its own (a managed copy of STREAM_FROM bytes or more, whose upload id it
        never gives): its intent journaled, so a crash during it leaves what the next mount
        needs to abort that upload."""
        uploads = store.multipart()
        if uploads is None or size < STREAM_FROM:
            yield
            return
        intended_at = self._intend(uploads, source, key)
        try:
            yield
        finally:
            self._journal.intent_ended(source, key, intended_at)

    def _metadata(self, entry: Pending, committed: bool) -> tuple[float | None, Attrs | None]:
        """The (mtime, attributes) a new upload of `entry` starts with (called with the lock
        held): the mtime only once the file is committed, as later writes would change it."""
        return entry.mtime if committed else None, entry.attrs or Attrs()

    def _start(self, uploads: MultipartUploads, source: str, key: str, mtime: float | None,
               attrs: Attrs | None) -> str:
        """The intent is on disk before the store is asked; the id replaces it once given."""
        intended_at = self._intend(uploads, source, key)
        upload_id = uploads.start_upload(key, mtime, attrs)
        self._journal.upload_started(source, key, upload_id, intended_at)
        return upload_id

    def _send(self, stream: Stream, end: int, last: bool) -> None:
        """Parts up to `end`; with `last`, the bytes short of a full part too."""
        while stream.sent < end:
            length = part_size(len(stream.parts) + 1)
            if stream.sent + length > end:
                if not last:
                    return
                length = end - stream.sent
            stream.parts.append(self._pool.submit(self._upload_part, stream,
                                                  len(stream.parts) + 1, stream.sent, length))
            stream.sent += length

    def _upload_part(self, stream: Stream, number: int, offset: int, length: int) -> Part:
        if stream.cancelled:
            raise StreamCancelled(stream.key)
        upload_id = stream.created.result()
        data = os.pread(stream.fd, length, offset)
        if len(data) != length:
            raise StreamCancelled(stream.key)
        part = stream.uploads.upload_part(stream.key, upload_id, number, data)
        _drop_cached(stream.fd, offset + length)
        return part

    def cancel(self, entry: Pending) -> None:
        """Stop streaming `entry` for good (called with the lock held): its file is no longer
        written front to back, or it is gone. Its upload is aborted in the background."""
        entry.appended_to = None
        stream = self._stream_of(entry)
        self._set_stream(entry, None)
        if stream is not None:
            self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        if not stream.cancelled:
            stream.cancelled = True
            self._pool.submit(self._abort, stream)

    def _abort(self, stream: Stream) -> None:
        """Abort after the parts in flight have ended: a part that lands after the abort would
        be kept by the store."""
        wait(stream.parts)
        try:
            upload_id = stream.created.result()
        except Exception:  # noqa: BLE001 - never started: nothing to abort
            self._close(stream)
            return
        try:
            stream.uploads.abort_upload(stream.key, upload_id)
        except Exception as error:  # noqa: BLE001 - the journal keeps it for the next mount
            log.warning("could not abort the multipart upload of %s (%s); the next mount tries "
                        "again", stream.key, error)
            self._close(stream)
            return
        self._close(stream, upload_id)

    def _close(self, stream: Stream, ended: str | None = None) -> None:
        """Let go of the stream's file; `ended` is its upload id once the store has no
        unfinished upload for it any more."""
        if ended is not None:
            self._journal.upload_ended(stream.source, stream.key, ended)
        os.close(stream.fd)
        with self._lock:
            self._active.discard(stream)

    def finish(self, entry: Pending, generation: int) -> Completed | None:
        """Send the rest of the file and complete its upload (in an uploader thread, once the
        file was committed: closed, or fsync'ed under --writeback sync); None if `entry` has no
        stream that can complete, so the caller uploads the file whole. Raises StoreError if
        the store failed the upload."""
        with self._lock:
            stream = self._stream_of(entry)
            if stream is None:
                return None
            size = entry.size
            if size < stream.sent:
                self.cancel(entry)
                return None
            self._send(stream, size, last=True)
        try:
            parts = [part.result() for part in stream.parts]
            upload_id = stream.created.result()
        except StreamCancelled:
            self._give_up(entry, stream)
            return None
        except Exception as error:
            self._give_up(entry, stream)
            raise StoreError(f"streamed upload of {entry.key!r} failed: {error}",
                             permanent=getattr(error, "permanent", False)) from None
        with self._lock:
            if stream.cancelled or entry.generation != generation:
                self._give_up(entry, stream)
                return None
            self._set_stream(entry, None)
            carries = stream.attrs == (entry.attrs or Attrs()) and (
                not entry.mtime_set if stream.mtime is None else stream.mtime == entry.mtime)
        try:
            info = stream.uploads.complete_upload(stream.key, upload_id, parts, size)
        except Exception:
            self._give_up(entry, stream)
            raise
        self._close(stream, upload_id)
        if stream.attrs is not None:
            info = replace(info, attrs=stream.attrs,
                           mtime=info.mtime if stream.mtime is None else stream.mtime)
        return Completed(info, carries)

    def _give_up(self, entry: Pending, stream: Stream) -> None:
        """The stream will not complete: abort it; the file goes up whole instead."""
        with self._lock:
            if self._stream_of(entry) is stream:
                self.cancel(entry)
            else:
                self._drop(stream)

    def stop(self) -> None:
        """Abort the streams of files still open at unmount; what they wrote stays journaled
        (if committed) and goes up whole with the next mount."""
        with self._lock:
            for stream in list(self._active):
                self._drop(stream)
        self._pool.shutdown(wait=True)


def _drop_cached(fd: int, end: int) -> None:
    """Let the kernel reuse the page cache of the file's first `end` bytes, which are in the
    store now: pages written back are dropped, dirty ones start their write-back (the close's
    fsync would wait for it anyway) and go at a later part's call. Why: a gigabyte written
    through the page cache takes a gigabyte of memory the kernel has to find, and writing into
    memory not touched lately costs far more CPU than reusing the pages of what went before
    (docs/optimization-history.md, "A property of this machine's memory")."""
    try:
        os.posix_fadvise(fd, 0, end, os.POSIX_FADV_DONTNEED)
    except OSError as error:  # advice only: the part is in the store either way
        log.debug("cannot drop the cached pages of a streamed file: %s", error)
