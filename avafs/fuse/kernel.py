"""What the kernel and pyfuse3 (as third_party/pyfuse3 patches it) offer the handlers, and the
one call that drops an inode's cached pages."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Executor

import pyfuse3

READER = {"noflush": True} if hasattr(pyfuse3.FileInfo(), "noflush") else {}
"""What a read-only open answers beside its handle: FOPEN_NOFLUSH where pyfuse3 exposes it
(third_party/pyfuse3's patch, which scripts/install.sh builds), so that closing a reader sends
no FLUSH, which would have nothing to commit; with stock pyfuse3 every close is a round trip.
FLUSH carries no lock release here: pyfuse3 has no lock requests, so the kernel keeps POSIX
locks itself."""
READS_NAME_INODE = getattr(pyfuse3, "READS_NAME_INODE_WITHOUT_OPEN", False)
"""Whether a read sent without an open names its inode (third_party/pyfuse3's patch; stock
pyfuse3 gives it the handle, 0 for every file then)."""
CACHES_DIRECTORIES = hasattr(pyfuse3.FileInfo(), "cache_readdir")
"""Whether opendir can ask the kernel to keep a directory's entries (third_party/pyfuse3's
patch; stock pyfuse3 takes a handle only, and every read of a directory is a request)."""
LIBFUSE_VERSION = getattr(pyfuse3, "LIBFUSE_VERSION", None)
"""The libfuse pyfuse3 runs on, as 317 for 3.17 (third_party/pyfuse3's patch; None on stock
pyfuse3)."""
PARALLEL_LOOKUPS = (hasattr(pyfuse3.Operations, "enable_parallel_dirops")
                    and LIBFUSE_VERSION is not None and LIBFUSE_VERSION >= 316)
"""Whether the kernel can be asked for parallel directory operations: pyfuse3 patched to ask
(third_party/pyfuse3) on a libfuse that passes the request on, 3.16 and later
(scripts/build_libfuse.sh). Without them the kernel holds a directory's lock through every
LOOKUP of a new name and every READDIR, so lookups in one directory wait for each other."""

FILE_RANGES = hasattr(pyfuse3, "FileRange")
"""Whether a read may be answered with a range of an open file (third_party/pyfuse3's patch),
which libfuse splices into /dev/fuse from the file's page cache where the kernel allows it:
no copy of the bytes through the daemon's memory, and none into its RAM tier."""


async def drop_pages(inode: int, threads: Executor) -> None:
    """The kernel's cached pages of an inode, dropped from a worker thread (the kernel
    answers when the pages being read are filled). An inode the kernel has forgotten has none."""
    with contextlib.suppress(OSError):
        await asyncio.get_running_loop().run_in_executor(threads, pyfuse3.invalidate_inode,
                                                         inode)

