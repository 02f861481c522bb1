"""Read-only views of an open data file for an upload: boto3 reads, seeks and tells them
(a retried request seeks back), and a subclass decides what `read` may return. Closing a view
leaves the underlying file to its owner."""

from __future__ import annotations

import io
from typing import BinaryIO


class FileView(io.RawIOBase):
    def __init__(self, file: BinaryIO) -> None:
        super().__init__()
        self._file = file

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()
