"""The quickstart's main job (scripts/quickstart.py, run by scripts/quickstart.sh) on a small
sample: it mounts, reads twice, unmounts, and leaves nothing behind unless told to keep it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import is_mounted

REPO = Path(__file__).resolve().parents[2]


def quickstart(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.quickstart", "--workdir", str(workdir),
                           "--large", "1", "--small", "20", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_the_sample_bucket_and_cache_are_removed_unless_kept(tmp_path):
    result = quickstart(tmp_path / "qs")
    assert result.returncode == 0, result.stderr
    assert "hit ratio" in result.stdout
    assert not (tmp_path / "qs").exists()

    kept = quickstart(tmp_path / "kept", "--keep")
    assert kept.returncode == 0, kept.stderr
    assert not is_mounted(tmp_path / "kept" / "mnt")
    assert len(list((tmp_path / "kept" / "bucket" / "small").rglob("*.bin"))) == 20
    assert (tmp_path / "kept" / "cache" / "avafs.log").exists()
