"""`python -m csi_driver` refuses bad flags with one line, as a crash-looping pod shows it."""

from __future__ import annotations

import subprocess
import sys

import pytest

GOOD = ["--endpoint", "unix:///tmp/csi-cli-test.sock", "--node-id", "node-1"]


@pytest.mark.parametrize("arguments, named", [
    ([], "--endpoint"),
    (["--endpoint", "unix:///tmp/x.sock"], "--node-id"),
    (["--endpoint", "tcp://127.0.0.1:10000", "--node-id", "n"], "unix:///"),
    ([*GOOD, "--driver-name", "avafs_csi!"], "domain name"),
    ([*GOOD, "--max-volumes-per-node", "-1"], "--max-volumes-per-node"),
    ([*GOOD, "--repair-interval", "often"], "--repair-interval"),
    ([*GOOD, "--log-level", "loud"], "--log-level"),
    (["--endpoint", "unix:///tmp/x.sock", "--node-id", " "], "--node-id"),
    ([*GOOD, "--mode", "both"], "--mode"),
    (["--endpoint", "unix:///tmp/x.sock", "--mode", "all"], "--node-id"),
], ids=["no endpoint", "no node id", "tcp endpoint", "bad driver name", "negative limit",
        "bad interval", "bad log level", "blank node id", "bad mode", "all mode without node id"])
def test_bad_flags_give_one_line_and_a_non_zero_exit(arguments, named):
    result = subprocess.run([sys.executable, "-m", "csi_driver", *arguments],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("avafs-csi: error: ") and named in result.stderr
