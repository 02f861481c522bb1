"""Where a mount keeps its files inside `--cache-dir`; one place, so tools agree on it."""

from pathlib import Path

LOG_FILE = "avafs.log"
PID_FILE = "avafs.pid"
LOCK_FILE = "lock"
DISK_TIER_DIR = "disk"
WRITEBACK_DIR = "writeback"
GENERATION_FILE = "generation"
LOCATIONS_FILE = "locations"


def log_path(cache_dir: Path) -> Path:
    return cache_dir / LOG_FILE
