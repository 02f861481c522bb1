"""Where a mount keeps its files inside `--cache-dir`, and who may read them.

The cache dir holds cached blocks, not-yet-uploaded data and a log that names files, so it is
private to the user who mounts: the directory is 0700 and the daemon creates everything in it
under a umask of 077. Closing the top directory is what protects the contents: files inside
that older versions left group- or world-readable need no sweep, because nobody else can
reach them through a 0700 directory.
"""

import os
import stat
from pathlib import Path

from .errors import AvafsError

LOG_FILE = "avafs.log"
PID_FILE = "avafs.pid"
LOCK_FILE = "lock"
DISK_TIER_DIR = "disk"
WRITEBACK_DIR = "writeback"
GENERATION_FILE = "generation"
LOCATIONS_FILE = "locations"

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
PRIVATE_UMASK = 0o077


def log_path(cache_dir: Path) -> Path:
    return cache_dir / LOG_FILE


def prepare_cache_dir(cache_dir: Path) -> None:
    """Create `cache_dir` private to this user, or make an existing one private.

    A directory owned by another user is refused rather than taken over: its owner could read
    whatever this mount caches in it.
    """
    cache_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    info = cache_dir.stat()
    if info.st_uid != os.geteuid():
        raise AvafsError(f"cache dir {cache_dir} belongs to uid {info.st_uid}, not to this user "
                         f"(uid {os.geteuid()}): give this mount a --cache-dir of its own")
    if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(cache_dir, PRIVATE_DIR_MODE)
    log = log_path(cache_dir)
    if log.exists() and stat.S_IMODE(log.stat().st_mode) != PRIVATE_FILE_MODE:
        os.chmod(log, PRIVATE_FILE_MODE)


def open_log_for_append(cache_dir: Path) -> int:
    """The log file as a descriptor a child process can write to, created owner-only."""
    return os.open(log_path(cache_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                   PRIVATE_FILE_MODE)
