"""A pyfuse3 file system that serves N files of 16 KiB from memory, and nothing else.

    python3 -m bench.experiments.trivial_fs MOUNTPOINT [FILES]

It measures pyfuse3's own ceiling for small files (lookup, open, read, flush, release per
file, answered without any work, on uvloop as avafs serves them), which bounds what any
pyfuse3 file system, avafs included, can serve: `python3 -m bench.probes pyfuse3-ceiling`
mounts it and reads every file.
"""

from __future__ import annotations

import errno
import stat
import sys

import pyfuse3
import pyfuse3.asyncio
import uvloop

FILE_SIZE = 16 * 1024
FIRST_INODE = 10


class TrivialFs(pyfuse3.Operations):
    def __init__(self, files: int) -> None:
        super().__init__()
        self.data = bytes(FILE_SIZE)
        self.inodes = {f"f{index}".encode(): FIRST_INODE + index for index in range(files)}

    def _attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        attributes = pyfuse3.EntryAttributes()
        attributes.st_ino = inode
        attributes.entry_timeout = attributes.attr_timeout = 300
        if inode == pyfuse3.ROOT_INODE:
            attributes.st_mode = stat.S_IFDIR | 0o755
        else:
            attributes.st_mode = stat.S_IFREG | 0o644
            attributes.st_size = FILE_SIZE
        return attributes

    async def getattr(self, inode, ctx=None):
        return self._attributes(inode)

    async def lookup(self, parent_inode, name, ctx=None):
        if name not in self.inodes:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(self.inodes[name])

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh, off, size):
        return self.data[off:off + size]


def main() -> int:
    files = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    options = set(pyfuse3.default_options) | {"fsname=trivialfs"}
    pyfuse3.asyncio.enable()
    pyfuse3.init(TrivialFs(files), sys.argv[1], options)
    try:
        uvloop.run(pyfuse3.main())
    finally:
        pyfuse3.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
