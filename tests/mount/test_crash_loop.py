"""The reliability suite's crash loop, a few cycles of it, as CI runs it (the long run is
`python3 -m bench.soak.crash_loop --cycles 50`): random writes, appends, truncates, renames,
directory renames and unlinks of open files on an s3:// mount, `kill -9` of the daemon at
random moments, remount, flush; nothing acknowledged may be lost or wrong, nothing deleted may
come back, and no multipart upload may be left open."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_short_crash_loop_loses_nothing(s3_server, bucket, tmp_path):
    report = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak.crash_loop", "--cycles", "4",
         "--big-every", "0", "--seed", "7", "--endpoint", s3_server.endpoint, "--bucket", bucket,
         "--workdir", str(tmp_path / "work"), "--json", str(report)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    figures = json.loads(report.read_text())
    assert figures["violations"] == []
    assert figures["cycles"] == figures["kills"] == 4
    assert figures["operations"] > 0 and figures["file_checks"] > 0
    assert figures["open_multipart_uploads"] == 0
