"""`file:///abs/dir`: a local directory used as a bucket (the embedded default).

Keys map to relative paths. The ETag is derived from size, mtime and ctime, so a rewritten file
is a new version and its cached blocks are never served for the new content, even where its
mtime was set back to an earlier version's (ctime cannot be set). A file's attributes are the
local file's own: its times, permission bits, owner and type, so files other tools put in the
directory read back with theirs, and a metadata-only change is a `utime`, `chmod` or `chown`.
A symbolic link is a local symbolic link, never followed here (its "object" is its target, as
in an S3 bucket); FIFOs, sockets and device nodes are local ones too. A directory marker
(`prefix/`) is the directory itself, with its own attributes.

What the local file system refuses for good (a path too long for it, a name it cannot hold, a
permission it does not give) is a permanent StoreError, so write-back sets it aside instead of
retrying it; what may pass (no space, an I/O error) is not.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat as stats
import tempfile
from pathlib import Path
from typing import BinaryIO

from ..errors import AvafsError, ObjectChangedError, StoreError
from .base import Listing, ObjectInfo, ObjectStore
from .metadata import SPECIAL_TYPES, Attrs

_PATH_MAX = 4096
_PERMANENT = frozenset({errno.ENAMETOOLONG, errno.EINVAL, errno.EFBIG, errno.EACCES,
                        errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
                        errno.ELOOP, errno.EILSEQ})
"""Errnos that the same request gets again however often it is sent."""


def _etag(stat: os.stat_result) -> str:
    return f"{stat.st_mtime_ns:x}-{stat.st_size:x}-{stat.st_ctime_ns:x}"


def _info(key: str, stat: os.stat_result) -> ObjectInfo:
    """A file's, link's, special file's or (for a `prefix/` key) directory's metadata, from
    its lstat."""
    file_type = stats.S_IFMT(stat.st_mode)
    special = file_type in SPECIAL_TYPES or file_type == stats.S_IFDIR
    return ObjectInfo(key, stat.st_size, _etag(stat), stat.st_mtime, Attrs(
        stat.st_mode & 0o7777, stat.st_uid, stat.st_gid,
        file_type=file_type if special else None,
        rdev=stat.st_rdev if file_type in (stats.S_IFCHR, stats.S_IFBLK) else None,
        atime=stat.st_atime, ctime=stat.st_ctime))


def _failure(action: str, path: Path, error: OSError) -> StoreError:
    return StoreError(f"cannot {action} {path}: {error.strerror}",
                      permanent=error.errno in _PERMANENT)


class LocalStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def keeps_owners(self) -> bool:
        """Only root may give a local file to another user."""
        return os.geteuid() == 0

    def key_fits(self, key: str) -> bool:
        return len(os.fsencode(self._path(key))) < _PATH_MAX

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
        except (FileNotFoundError, NotADirectoryError):
            return Listing([], [])
        except OSError as error:
            raise _failure("list", self._path(prefix), error) from None
        if prefix:  # the directory itself, as a listing of S3 shows its marker object
            with contextlib.suppress(FileNotFoundError):
                objects.append(_info(prefix, os.lstat(self._path(prefix))))
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    prefixes.append(f"{prefix}{entry.name}/")
                elif not entry.name.startswith(".avafs-upload-"):
                    objects.append(_info(prefix + entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue
        return Listing(sorted(prefixes), sorted(objects, key=lambda info: info.key))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            stat = os.lstat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as error:
            raise _failure("stat", self._path(key), error) from None
        if stats.S_ISDIR(stat.st_mode) != key.endswith("/"):
            return None
        return _info(key, stat)

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        path = self._path(key)
        try:
            if os.path.islink(path):
                return self._link_target(key, etag)[start:start + length]
            with open(path, "rb") as file:
                if _etag(os.fstat(file.fileno())) != etag:
                    raise ObjectChangedError(f"{self.url}/{key} changed while being read")
                return os.pread(file.fileno(), length, start)
        except FileNotFoundError:
            raise ObjectChangedError(f"{self.url}/{key} was deleted while being read") from None
        except OSError as error:
            raise _failure("read", path, error) from None

    def _link_target(self, key: str, etag: str) -> bytes:
        """A symbolic link's body: its target, of the version `etag`."""
        path = self._path(key)
        target = os.readlink(os.fsencode(path))
        if _etag(os.lstat(path)) != etag:
            raise ObjectChangedError(f"{self.url}/{key} changed while being read")
        return target

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        if os.path.islink(self._path(key)):
            return super().open_range(key, start, length, etag)
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
        try:
            if key.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
                if mtime is not None:
                    self._set_attributes(path, mtime, attrs or Attrs())
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                if attrs is not None and attrs.file_type in SPECIAL_TYPES:
                    self._put_special(path, body, mtime, attrs)
                else:
                    self._put_file(path, body, mtime, attrs)
        except OSError as error:
            raise _failure("write", path, error) from None
        info = self.head(key)
        if info is None:
            raise StoreError(f"{path} is missing right after it was written")
        return info

    def _put_file(self, path: Path, body: BinaryIO, mtime: float | None,
                  attrs: Attrs | None) -> None:
        descriptor, temporary = tempfile.mkstemp(prefix=".avafs-upload-", dir=path.parent)
        try:
            os.fchmod(descriptor, 0o644)
            with os.fdopen(descriptor, "wb") as target:
                shutil.copyfileobj(body, target, 1 << 20)
                target.flush()
                if mtime is not None:
                    self._set_attributes(target.fileno(), mtime, attrs or Attrs())
                os.fsync(target.fileno())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise

    def _put_special(self, path: Path, body: BinaryIO, mtime: float | None,
                     attrs: Attrs) -> None:
        """A symbolic link (the body is its target) or a FIFO, socket or device node, made
        under a temporary name and renamed over `path`, as a file is."""
        temporary = path.with_name(f".avafs-upload-{os.urandom(8).hex()}")
        if attrs.file_type == stats.S_IFLNK:
            os.symlink(body.read(), os.fsencode(temporary))
        else:
            os.mknod(temporary, attrs.file_type | (0o644 if attrs.mode is None else attrs.mode),
                     attrs.rdev or 0)
        try:
            if mtime is not None:
                self._set_attributes(temporary, mtime, attrs)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise

    @staticmethod
    def _set_attributes(file: int | Path, mtime: float, attrs: Attrs) -> None:
        """Give the open file (or the path, never followed) these attributes; raises OSError
        where the daemon may not (a chown to another user needs root), which the caller makes
        a StoreError, so the change stays pending. A link's permission bits cannot be set."""
        follow = isinstance(file, int)
        if attrs.uid is not None or attrs.gid is not None:
            os.chown(file, -1 if attrs.uid is None else attrs.uid,
                     -1 if attrs.gid is None else attrs.gid, follow_symlinks=follow)
        if attrs.mode is not None and attrs.file_type != stats.S_IFLNK:
            os.chmod(file, attrs.mode)
        nanoseconds = round(mtime * 1e9)
        accessed = nanoseconds if attrs.atime is None else round(attrs.atime * 1e9)
        os.utime(file, ns=(accessed, nanoseconds), follow_symlinks=follow)

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
            raise _failure("delete", path, error) from None

    def copy(self, source_key: str, key: str, etag: str, mtime: float | None = None,
             attrs: Attrs | None = None) -> ObjectInfo:
        source_path = self._path(source_key)
        try:
            stat = os.lstat(source_path)
            if _etag(stat) != etag:
                raise ObjectChangedError(f"{self.url}/{source_key} changed before its copy")
            if mtime is None:  # a rename keeps the times, mode and type (the owner is the daemon's)
                mtime, attrs = stat.st_mtime, _info(key, stat).attrs
                attrs = Attrs(attrs.mode, file_type=attrs.file_type, rdev=attrs.rdev,
                              atime=attrs.atime)
            if not stats.S_ISREG(stat.st_mode):
                if source_key == key:
                    self._set_attributes(source_path, mtime, attrs or Attrs())
                    return _info(key, os.lstat(source_path))
                return self.put(key, io.BytesIO(self._link_target(source_key, etag)
                                                if stats.S_ISLNK(stat.st_mode) else b""),
                                stat.st_size, mtime, attrs)
            with open(source_path, "rb") as source:
                if _etag(os.fstat(source.fileno())) != etag:
                    raise ObjectChangedError(f"{self.url}/{source_key} changed before its copy")
                if source_key == key:
                    self._set_attributes(source.fileno(), mtime, attrs or Attrs())
                    return _info(key, os.fstat(source.fileno()))
                return self.put(key, source, stat.st_size, mtime, attrs)
        except FileNotFoundError:
            raise ObjectChangedError(f"{self.url}/{source_key} vanished before its copy") from None
        except OSError as error:
            raise _failure("copy to", self._path(key), error) from None
