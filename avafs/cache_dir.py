"""Where a mount keeps its files: the default `--cache-dir`, and the files inside it; one place,
so tools agree on it."""

from __future__ import annotations

import hashlib
import json
import os
import re
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
