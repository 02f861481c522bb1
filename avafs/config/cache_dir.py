"""Where a mount keeps its files: the default `--cache-dir`, the files inside it, and who may
read them; one place, so tools agree on it.

The cache dir holds cached blocks, not-yet-uploaded data and a log that names files, so it is
private to the user who mounts: the directory is 0700 and the daemon creates everything in it
under a umask of 077. Closing the top directory is what protects the contents: files inside
that older versions left group- or world-readable need no sweep, because nobody else can
reach them through a 0700 directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from contextlib import suppress
from pathlib import Path

from ..errors import AvafsError

LOG_FILE = "avafs.log"
PID_FILE = "avafs.pid"
LOCK_FILE = "lock"
DISK_TIER_DIR = "disk"
WRITEBACK_DIR = "writeback"
ATTRIBUTES_DIR = "attributes"
GENERATION_FILE = "generation"
LOCATIONS_FILE = "locations"

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
PRIVATE_UMASK = 0o077

_CACHE_DIR_FIX = "give --cache-dir a directory this user can create and write"


def log_path(cache_dir: Path) -> Path:
    return cache_dir / LOG_FILE


def prepare_cache_dir(cache_dir: Path) -> bool:
    """Create `cache_dir` private to this user, or make an existing one private; True if it
    was created here (a mount that then fails removes it again, see `remove_unused`).

    A directory owned by another user is refused rather than taken over: its owner could read
    whatever this mount caches in it. A path that cannot be a cache dir (a file, a directory
    that cannot be created or written) is refused here, in one line, before the daemon
    trips over it.
    """
    created = _make_dir(cache_dir)
    if not os.access(cache_dir, os.W_OK | os.X_OK):
        read_only = os.statvfs(cache_dir).f_flag & os.ST_RDONLY
        raise AvafsError(f"cache dir {cache_dir} is not writable "
                         + ("(its file system is mounted read-only)" if read_only
                            else f"by this user (uid {os.geteuid()})")
                         + f": {_CACHE_DIR_FIX}")
    info = cache_dir.stat()
    if info.st_uid != os.geteuid():
        raise AvafsError(f"cache dir {cache_dir} belongs to uid {info.st_uid}, not to this user "
                         f"(uid {os.geteuid()}): give this mount a --cache-dir of its own")
    try:
        if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
            os.chmod(cache_dir, PRIVATE_DIR_MODE)
        log = log_path(cache_dir)
        if log.exists() and stat.S_IMODE(log.stat().st_mode) != PRIVATE_FILE_MODE:
            os.chmod(log, PRIVATE_FILE_MODE)
    except OSError as error:
        raise AvafsError(f"cannot make cache dir {cache_dir} private: {error.strerror}: "
                         f"{_CACHE_DIR_FIX}") from None
    return created


def _make_dir(cache_dir: Path) -> bool:
    """mkdir -p, True if `cache_dir` itself is new; what stands in the way is named."""
    try:
        cache_dir.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
        return True
    except FileExistsError:
        if cache_dir.is_dir():
            return False
        raise AvafsError(f"cache dir {cache_dir} is a file, not a directory: remove it or "
                         "give --cache-dir another path") from None
    except OSError as error:
        blocker = next((parent for parent in cache_dir.parents if parent.exists()), None)
        if blocker is not None and not blocker.is_dir():
            reason = f"{blocker} is a file, not a directory"
        else:
            reason = error.strerror
        raise AvafsError(f"cannot create cache dir {cache_dir}: {reason}: {_CACHE_DIR_FIX}") \
            from None


def remove_unused(cache_dir: Path) -> None:
    """Remove a cache dir that a mount created and then failed in before caching or
    journaling anything, so failed attempts leave nothing behind (a mistyped bucket would
    otherwise leave a default cache dir named after the typo, one per try). Anything in it
    but what a failed start writes (the log, the lock, the pid file) keeps it."""
    try:
        names = set(os.listdir(cache_dir))
    except OSError:
        return
    if names <= {LOG_FILE, LOCK_FILE, PID_FILE}:
        for name in names:
            (cache_dir / name).unlink(missing_ok=True)
        with suppress(OSError):
            cache_dir.rmdir()


def open_log_for_append(path: Path) -> int:
    """The log file as a descriptor a child process can write to, created owner-only; one
    that cannot be opened is named in one line (a `--log-file` in a missing directory)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                       PRIVATE_FILE_MODE)
    except OSError as error:
        raise AvafsError(f"cannot open log file {path}: {error.strerror}: give --log-file a "
                         "file in a directory this user can write") from None


def default_cache_root() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/avafs")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "avafs"


def default_cache_dir(sources: dict[str, str], endpoint_url: str | None, block_size: int) -> Path:
    """A directory of its own under the default root for each set of sources and each option
    that changes what cached data means (the S3 endpoint, the block size): one daemon locks a
    cache dir, so two mounts of different buckets with default settings each get their own,
    and remounting the same bucket finds its cache and journal again. The name starts with the
    end of the first source's URL (its bucket or directory), readable in `ls`; a hash of
    everything that sets it apart follows."""
    if endpoint_url is None and any(url.startswith("s3:") for url in sources.values()):
        endpoint_url = os.environ.get("AWS_ENDPOINT_URL")
    identity = json.dumps({"sources": sorted(sources.items()), "endpoint_url": endpoint_url,
                           "block_size": block_size})
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    label = re.sub(r"[^A-Za-z0-9._]+", "-", sorted(sources.values())[0])[-48:].strip("-")
    return default_cache_root() / f"{label}-{digest}"


def unuploaded_in_shared_default(cache_dir: Path) -> int:
    """Files not yet uploaded in the cache dir that every mount shared by default before each
    set of sources got its own (the default root itself), when this mount uses another one:
    only a mount that names that directory uploads them, so the user must be told."""
    root = default_cache_root()
    data = root / WRITEBACK_DIR / "data"
    if cache_dir == root or not data.is_dir():
        return 0
    return sum(1 for _ in data.iterdir())
