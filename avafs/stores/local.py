"""`file:///abs/dir`: a local directory used as a bucket (the embedded default).

Keys map to relative paths. The ETag is derived from size and mtime (as web servers do), so a
rewritten file is a new version and its cached blocks are never served for the new content.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from ..errors import AvafsError, ObjectChangedError, StoreError
from .base import Listing, ObjectInfo, ObjectStore


def _etag(stat: os.stat_result) -> str:
    return f"{stat.st_mtime_ns:x}-{stat.st_size:x}"


class LocalStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def check(self) -> None:
        if not self.root.is_dir():
            raise AvafsError(f"bucket directory {self.root} not found: create it or fix the "
                             "file:// URL")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise AvafsError(f"access denied to bucket directory {self.root}: check its "
                             "permissions")

    def _path(self, key: str) -> Path:
        return self.root / key

    def list_dir(self, prefix: str) -> Listing:
        prefixes: list[str] = []
        objects: list[ObjectInfo] = []
        try:
            entries = list(os.scandir(self._path(prefix)))
        except FileNotFoundError:
            return Listing([], [])
        except OSError as error:
            raise StoreError(f"cannot list {self._path(prefix)}: {error.strerror}") from None
        for entry in entries:
            try:
                if entry.is_dir():
                    prefixes.append(f"{prefix}{entry.name}/")
                elif entry.is_file():
                    stat = entry.stat()
                    objects.append(ObjectInfo(prefix + entry.name, stat.st_size, _etag(stat),
                                              stat.st_mtime))
            except FileNotFoundError:
                continue
        return Listing(sorted(prefixes), sorted(objects, key=lambda info: info.key))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            stat = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(self._path(key)):
            return None
        return ObjectInfo(key, stat.st_size, _etag(stat), stat.st_mtime)

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        try:
            with open(self._path(key), "rb") as file:
                if _etag(os.fstat(file.fileno())) != etag:
                    raise ObjectChangedError(f"{self.url}/{key} changed while being read")
                return os.pread(file.fileno(), length, start)
        except FileNotFoundError:
            raise ObjectChangedError(f"{self.url}/{key} was deleted while being read") from None
        except OSError as error:
            raise StoreError(f"cannot read {self._path(key)}: {error.strerror}") from None

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        try:
            file = open(self._path(key), "rb")  # noqa: SIM115 - the caller closes the stream
        except FileNotFoundError:
            raise ObjectChangedError(f"{self.url}/{key} was deleted while being read") from None
        if _etag(os.fstat(file.fileno())) != etag:
            file.close()
            raise ObjectChangedError(f"{self.url}/{key} changed while being read")
        file.seek(start)
        return file

    def put(self, key: str, body: BinaryIO, size: int) -> ObjectInfo:
        path = self._path(key)
        if key.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            return ObjectInfo(key, 0, "", path.stat().st_mtime)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=".avafs-upload-", dir=path.parent)
        try:
            os.fchmod(descriptor, 0o644)
            with os.fdopen(descriptor, "wb") as target:
                shutil.copyfileobj(body, target, 1 << 20)
                target.flush()
                os.fsync(target.fileno())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        info = self.head(key)
        assert info is not None
        return info

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            if key.endswith("/"):
                path.rmdir()
            else:
                path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as error:
            raise StoreError(f"cannot delete {path}: {error.strerror}") from None

    def copy(self, source_key: str, key: str, etag: str) -> ObjectInfo:
        try:
            with open(self._path(source_key), "rb") as source:
                if _etag(os.fstat(source.fileno())) != etag:
                    raise ObjectChangedError(f"{self.url}/{source_key} changed before its copy")
                return self.put(key, source, os.fstat(source.fileno()).st_size)
        except FileNotFoundError:
            raise ObjectChangedError(f"{self.url}/{source_key} vanished before its copy") from None
