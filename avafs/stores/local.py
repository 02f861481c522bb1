"""`file:///abs/dir`: a local directory used as a bucket (the embedded default).

Keys map to relative paths. The ETag is derived from size, mtime and ctime, so a rewritten file
is a new version and its cached blocks are never served for the new content, even where its
mtime was set back to an earlier version's (ctime cannot be set). A file's attributes are the
local file's own: its mtime, permission bits and owner, so files other tools put in the
directory read back with theirs, and a metadata-only change is a `utime`, `chmod` or `chown`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from ..errors import AvafsError, ObjectChangedError, StoreError
from .base import Listing, ObjectInfo, ObjectStore
from .metadata import Attrs


def _etag(stat: os.stat_result) -> str:
    return f"{stat.st_mtime_ns:x}-{stat.st_size:x}-{stat.st_ctime_ns:x}"


def _info(key: str, stat: os.stat_result) -> ObjectInfo:
    return ObjectInfo(key, stat.st_size, _etag(stat), stat.st_mtime,
                      Attrs(stat.st_mode & 0o7777, stat.st_uid, stat.st_gid))


class LocalStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def keeps_owners(self) -> bool:
        """Only root may give a local file to another user."""
        return os.geteuid() == 0

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
                    objects.append(_info(prefix + entry.name, entry.stat()))
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
        return _info(key, stat)

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

    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
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
                if mtime is not None:
                    self._set_attributes(target.fileno(), key, mtime, attrs or Attrs())
                os.fsync(target.fileno())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        info = self.head(key)
        assert info is not None
        return info

    def _set_attributes(self, file: int, key: str, mtime: float, attrs: Attrs) -> None:
        """Give the open file these attributes; raises StoreError where the
        daemon may not (a chown to another user needs root), so the change stays pending."""
        try:
            if attrs.uid is not None or attrs.gid is not None:
                os.chown(file, -1 if attrs.uid is None else attrs.uid,
                         -1 if attrs.gid is None else attrs.gid)
            if attrs.mode is not None:
                os.chmod(file, attrs.mode)
            nanoseconds = round(mtime * 1e9)
            os.utime(file, ns=(nanoseconds, nanoseconds))
        except OSError as error:
            raise StoreError(f"cannot set the attributes of {self._path(key)}: "
                             f"{error.strerror}") from None

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

    def copy(self, source_key: str, key: str, etag: str, mtime: float | None = None,
             attrs: Attrs | None = None) -> ObjectInfo:
        try:
            with open(self._path(source_key), "rb") as source:
                stat = os.fstat(source.fileno())
                if _etag(stat) != etag:
                    raise ObjectChangedError(f"{self.url}/{source_key} changed before its copy")
                if mtime is None:  # a rename keeps the time and mode (the owner is the daemon's)
                    mtime, attrs = stat.st_mtime, Attrs(mode=stat.st_mode & 0o7777)
                if source_key == key:
                    self._set_attributes(source.fileno(), key, mtime, attrs or Attrs())
                    return _info(key, os.fstat(source.fileno()))
                return self.put(key, source, stat.st_size, mtime, attrs)
        except FileNotFoundError:
            raise ObjectChangedError(f"{self.url}/{source_key} vanished before its copy") from None
