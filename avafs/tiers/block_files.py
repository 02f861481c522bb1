"""Writing the disk tier's block files without filling the page cache with them.

A cold read of a large file writes every block to the disk tier once, and through the page
cache that write is a copy into memory the kernel has to find for it, which can be the
daemon's largest cost during cold reads (docs/optimization-history.md, "A property of this machine's
memory"). Written with O_DIRECT from a buffer that is reused, the same block costs a fraction
of that CPU, and the kernel keeps no second copy of bytes the RAM tier already holds. Readers
of the block file read it from the device the first time.

Small blocks are written through the page cache: for them creating the file dominates either
way, and a direct write would only add the device's latency to the caller, which may be the
FUSE loop. File systems that refuse O_DIRECT (tmpfs before Linux
6.6, for one) get buffered writes too.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import queue
import threading
from pathlib import Path

log = logging.getLogger(__name__)

DIRECT_MIN_SIZE = 1 << 20
"""Blocks at least this large are written with O_DIRECT."""

_ALIGNMENT = 4096
"""O_DIRECT's alignment of memory, offset and length: a device's logical block is 512 or 4096."""


class BlockFileWriter:
    """Writes whole files, each once; at most `buffers` direct writes run at a time, so the
    aligned buffers cost `buffers` blocks of memory however many threads fetch."""

    def __init__(self, buffers: int = 4) -> None:
        self._direct = hasattr(os, "O_DIRECT")
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(buffers)

    def write(self, path: str, data: bytes) -> None:
        if not self._direct or len(data) < DIRECT_MIN_SIZE:
            _write_buffered(path, data)
            return
        with self._slots:
            buffer = self._buffer(len(data))
            try:
                written = self._write_direct(path, data, buffer)
            finally:
                self._free.put(buffer)
        if not written:
            _write_buffered(path, data)

    def _buffer(self, size: int) -> mmap.mmap:
        padded = _aligned(size)
        try:
            buffer = self._free.get_nowait()
        except queue.Empty:
            return mmap.mmap(-1, padded)
        if len(buffer) < padded:
            buffer.close()
            return mmap.mmap(-1, padded)
        return buffer

    def _write_direct(self, path: str, data: bytes, buffer: mmap.mmap) -> bool:
        """False, having written nothing that stays, if this file system refuses O_DIRECT."""
        padded = _aligned(len(data))
        buffer[:len(data)] = data
        buffer[len(data):padded] = bytes(padded - len(data))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT
                         | os.O_CLOEXEC, 0o644)
        except OSError as error:
            return self._refused(error)
        try:
            with memoryview(buffer) as whole, whole[:padded] as view:
                _write_all(fd, view)
            if padded != len(data):
                os.ftruncate(fd, len(data))
        except OSError as error:
            os.close(fd)
            Path(path).unlink(missing_ok=True)
            return self._refused(error)
        os.close(fd)
        return True

    def _refused(self, error: OSError) -> bool:
        if error.errno != errno.EINVAL:
            raise error
        if self._direct:
            log.info("disk tier: the cache dir's file system refuses O_DIRECT (%s); blocks "
                     "are written through the page cache", error.strerror)
        self._direct = False
        return False


def _write_buffered(path: str, data: bytes) -> None:
    """The file written through the page cache: one open and a write, without the buffered
    file object's Python that a small block would mostly pay for."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        with memoryview(data) as view:
            _write_all(fd, view)
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    """`os.write` until the whole view is written (a write may take only part of it)."""
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def _aligned(size: int) -> int:
    return -(-size // _ALIGNMENT) * _ALIGNMENT
