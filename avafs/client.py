"""`Client(mountpoint)`: the Python face of a mount's control socket.

Public API: the CLI, the training adapters and the CSI driver use it, never private modules.
The socket is found from the mountpoint itself (an extended attribute of the mount's root),
so callers need to know nothing about cache dirs.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .errors import NEW_OBJECTS_HINT, AvafsError
from .host.mounts import AVAFS_FSTYPE, containing_mount, is_dead, mount_at
from .reader.control_socket import Connection, call
from .reader.known_locations import KnownLocations, known_locations
from .reader.manifest import ManifestError, read_manifest

CONTROL_XATTR = "user.avafs.control"


__all__ = ["NEW_OBJECTS_HINT", "AvafsError", "Client", "ManifestError", "NotAnAvafsMount",
           "dead_mount_error"]


class NotAnAvafsMount(AvafsError):
    """The path is not inside an avafs mount."""


def dead_mount_error(mountpoint: Path) -> AvafsError:
    """What every command says of a mount whose daemon exited."""
    return AvafsError(f"{mountpoint} is a dead mount (its daemon exited): run "
                      f"'avafs umount {mountpoint}' first")


class Client:
    """A mount's control client. `mountpoint` may also be a bind mount of a directory of the
    mount (a CSI volume's subPath in a pod): paths are then taken relative to that directory."""

    def __init__(self, mountpoint: str | os.PathLike) -> None:
        self.mountpoint = Path(os.path.abspath(mountpoint))
        try:
            self.socket = Path(os.getxattr(self.mountpoint, CONTROL_XATTR).decode())
        except OSError:
            if is_dead(self.mountpoint):
                raise dead_mount_error(self.mountpoint) from None
            raise NotAnAvafsMount(f"{self.mountpoint} is not an avafs mount") from None
        entry = mount_at(self.mountpoint)
        self.root = entry.root.strip("/") if entry and entry.fstype == AVAFS_FSTYPE else ""
        self._base = str(self.mountpoint).rstrip("/")
        self._cache_dir = str(self.socket.parent)
        self._reads: Connection | None = None
        self._reads_pid = 0
        self._in_place = True
        self._reads_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """A client travels to DataLoader workers; its connection and lock stay behind."""
        state = dict(self.__dict__)
        state.update(_reads=None, _reads_pid=0, _reads_lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _reads_lock=threading.Lock())

    @classmethod
    def for_path(cls, path: str | os.PathLike) -> Client:
        """The client of the avafs mount that `path` lies in."""
        entry = containing_mount(Path(path))
        if entry is None or entry.fstype != AVAFS_FSTYPE:
            raise NotAnAvafsMount(f"{os.path.abspath(path)} is not inside an avafs mount: mount "
                                  "the bucket with 'avafs mount' and use a path under it")
        return cls(entry.mount_point)

    def relative(self, path: str | os.PathLike) -> str:
        """A path relative to the mount's root directory; relative input is taken as relative
        to this client's mountpoint. String operations, not pathlib: batched reads call this
        for every sample."""
        text = os.fspath(path)
        if text.startswith("/"):
            absolute = os.path.normpath(text)
            base = self._base
            if absolute != (base or "/") and not absolute.startswith(base + "/"):
                raise AvafsError(f"{absolute} is not inside the mount {self.mountpoint}")
            text = absolute[len(base) + 1:]
        text = text.strip("/")
        if self.root:
            return f"{self.root}/{text}" if text else self.root
        return text or "."

    def _items(self, paths: Iterable[str | os.PathLike],
               manifest: str | os.PathLike | None = None) -> list[dict[str, str]]:
        items = [{"path": self.relative(path)} for path in paths]
        if manifest is not None:
            items.extend(entry.location() for entry in read_manifest(manifest))
        return items

    def _call(self, op: str, progress: Callable[[dict], None] | None = None,
              timeout: float | None = 60.0, **arguments: Any) -> dict[str, Any]:
        return call(self.socket, {"op": op, **arguments}, progress, timeout)

    @property
    def control_visible(self) -> bool:
        """Whether this process can see the daemon's control socket: not in a pod's view of
        a CSI volume, where only the mount is bind-mounted in; the mount is then read
        directly."""
        return self.socket.exists()

    def status(self) -> dict[str, Any]:
        """The documented status document (see README, "Status JSON")."""
        return self._call("status")

    def refresh(self, path: str | os.PathLike) -> dict[str, Any]:
        """Forget the cached listings and attributes at and under `path`, so objects created,
        changed or deleted in the store since show now instead of after --metadata-ttl."""
        return self._call("refresh", path=self.relative(path))

    def check(self, paths: Iterable[str | os.PathLike] = (),
              manifest: str | os.PathLike | None = None, tier: str = "disk") -> dict[str, Any]:
        """How much of these files (directories recursively, manifest entries) the tier holds,
        fetching nothing: files_total, bytes_total, files_cached, bytes_cached, failures."""
        items = self._items(paths, manifest)
        if not items:
            raise AvafsError("nothing to check: give paths or a manifest")
        return self._call("check", timeout=None, items=items, tier=tier)

    def warmup(self, paths: Iterable[str | os.PathLike] = (),
               manifest: str | os.PathLike | None = None, threads: int = 8, tier: str = "disk",
               background: bool = False,
               progress: Callable[[dict], None] | None = None,
               snapshot: str | None = None) -> dict[str, Any]:
        """Load files (directories recursively, manifest entries) into the cache; with
        `snapshot`, exactly the files that snapshot of the source of `paths` (or of the
        mount's one source) records, as their recorded versions.

        Returns the final warmup state, or at once the started one with `background`.
        """
        if snapshot is not None:
            anchors = [self.relative(path) for path in paths]
            return self._call("warmup", progress, timeout=None, snapshot=snapshot,
                              path=anchors[0] if anchors else "", threads=threads, tier=tier,
                              background=background)
        items = self._items(paths, manifest)
        if not items:
            raise AvafsError("nothing to warm up: give paths or a manifest")
        return self._call("warmup", progress, timeout=None, items=items, threads=threads,
                          tier=tier, background=background)

    def snapshot(self, action: str, path: str | os.PathLike, **fields: Any) -> dict[str, Any]:
        """`avafs snapshot ACTION` on the snapshots of the source `path` (a directory of the
        mount) lies in: `create` (`name`; it records the tree under `path`, after uploading
        what was written there), `list`, `delete` (`name`), `diff` (`names`, two)."""
        return self._call("snapshot", timeout=None, action=action, path=self.relative(path),
                          **fields)

    def prefetch(self, paths: Iterable[str | os.PathLike]) -> int:
        """Queue files for background loading below demand reads; returns how many."""
        return self._call("prefetch", items=self._items(paths))["queued"]

    def cached(self, paths: Iterable[str | os.PathLike]) -> list[float | None]:
        """For each file (or directory, recursively), the share of its blocks the mount's
        cache holds, 0.0 to 1.0 (None: not in the mount). Tells the cache these files are
        about to be read: the `dataset` policy counts that as a read of the cached ones."""
        return self._call("cached", timeout=None, items=self._items(paths))["shares"]

    def evict(self, paths: Iterable[str | os.PathLike]) -> dict[str, Any]:
        """Drop clean cached blocks of files (directories recursively)."""
        return self._call("evict", timeout=None, items=self._items(paths))

    def list_files(self, directory: str | os.PathLike) -> list[str]:
        """Absolute paths of every file under a directory of the mount, recursively, in one
        request: the daemon answers from its cached listings, where a walk through the
        mount costs a FUSE readdir per directory and a reply per entry (a DataLoader worker
        lists its dataset again every epoch)."""
        files = self._call("list", path=self.relative(directory))["files"]
        skip = len(self.root) + 1 if self.root else 0
        return [f"{self._base}/{path[skip:]}" for path in files]

    def read_files(self, paths: Iterable[str | os.PathLike]) -> list[bytes]:
        """The whole contents of files, in one request to the daemon: what reading each file
        through the mount gives, without FUSE's four round trips per file (the training
        adapters' one-file samples). Raises the OSError that open() or read() would raise
        for the first file that fails; files too large for one answer are read through the
        mount.

        Files the daemon's disk tier holds are read here, in place, from the cache dir (a
        short-circuit read): the daemon only looks them up, and this process remembers where
        they were for as long as the daemon allows (`known_locations.py`), so reading them again
        needs no request; nor does a file the daemon told another reader about, through its
        snapshot. One evicted meanwhile is asked for again; a cache dir this process cannot
        read (another mount namespace, other user) turns in-place reads off for this client."""
        paths = list(paths)
        relatives = [self.relative(path) for path in paths]
        contents: list[bytes | None] = [None] * len(paths)
        known = known_locations(self._cache_dir) if self._in_place else None
        if known is not None:
            known.begin()
            now = time.monotonic()
            self._read_remembered(relatives, contents, known, now)
            if None in contents and known.load_snapshot(now):
                self._read_remembered(relatives, contents, known, now)
        missed = [index for index, data in enumerate(contents) if data is None]
        if missed:
            fetched = self._read_files([paths[index] for index in missed],
                                       [relatives[index] for index in missed], self._in_place,
                                       known)
            for index, data in zip(missed, fetched, strict=True):
                contents[index] = data
        return contents  # type: ignore[return-value]

    def _read_remembered(self, relatives: list[str], contents: list[bytes | None],
                         known: KnownLocations, now: float) -> None:
        """Fills in `contents` that are still missing from the files `known` remembers."""
        for index, relative in enumerate(relatives):
            if contents[index] is not None:
                continue
            located = known.get(relative, now)
            if located is not None:
                contents[index] = self._read_in_place(*located)
                if contents[index] is None:
                    known.forget(relative)

    def _read_files(self, paths: list[str | os.PathLike], relatives: list[str], in_place: bool,
                    known: KnownLocations | None) -> list[bytes]:
        """One request; answers in place are remembered in `known`, if given."""
        asked_at = time.monotonic()
        result, payload = self._read_request(relatives, in_place)
        errors, files = result["errors"], result.get("files", {})
        contents: list[bytes | None] = []
        offset = 0
        for index, (path, size) in enumerate(zip(paths, result["sizes"], strict=True)):
            failure = errors.get(str(index))
            located = files.get(str(index))
            if located is not None:
                contents.append(self._read_in_place(*located))
            elif failure is None:
                contents.append(payload[offset:offset + size])
            elif failure[0] == errno.EFBIG:
                with open(self.mountpoint / path, "rb", buffering=0) as file:
                    contents.append(file.readall())
            else:
                raise OSError(failure[0], failure[1], os.fspath(path))
            offset += size
        if known is not None and "generation" in result:
            known.keep(result["generation"],
                       {relatives[int(index)]: located for index, located in files.items()
                        if contents[int(index)] is not None}, result["keep_for"], asked_at)
        missed = [index for index, data in enumerate(contents) if data is None]
        if missed:
            again = self._read_files([paths[index] for index in missed],
                                     [relatives[index] for index in missed], False, None)
            for index, data in zip(missed, again, strict=True):
                contents[index] = data
        return contents  # type: ignore[return-value]

    def _read_request(self, relatives: list[str], in_place: bool) -> tuple[dict[str, Any], bytes]:
        with self._reads_lock:
            if self._reads is None or self._reads_pid != os.getpid():
                self._reads = Connection(self.socket, timeout=None)
                self._reads_pid = os.getpid()
            try:
                return self._reads.request({"op": "read", "paths": relatives,
                                            "in_place": in_place}, timeout=None)
            except (AvafsError, OSError) as error:
                self._reads.close()
                self._reads = None
                if isinstance(error, AvafsError):
                    raise
                raise AvafsError(f"the mount's daemon stopped answering on {self.socket}: "
                                 f"{error}") from None

    def _read_in_place(self, relative: str, size: int) -> bytes | None:
        """A cached block file's bytes; None if it is gone (evicted) or unreadable here."""
        try:
            descriptor = os.open(f"{self._cache_dir}/{relative}", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError:
            self._in_place = False
            return None
        try:
            data = os.read(descriptor, size)
            while len(data) < size and (more := os.read(descriptor, size - len(data))):
                data += more
        finally:
            os.close(descriptor)
        return data if len(data) == size else None

    def flush(self, progress: Callable[[dict], None] | None = None,
              path: str | os.PathLike | None = None,
              timeout: float | None = None) -> dict[str, Any]:
        """Upload what was written so far (under `path`, or everything) and wait until the
        store has it, or `timeout` seconds; the answer counts what is still pending there
        (`upload_queue` 0 when all of it is in the store)."""
        where = {} if path is None else {"path": self.relative(path)}
        return self._call("flush", progress, timeout=None, limit=timeout, **where)
