"""A pod's view of a CSI volume: the mount is visible, the daemon's control socket is not.

Reproduced with a private mount namespace in which a tmpfs hides the mount's cache dir, as a
pod's mount namespace holds the bind-mounted volume and nothing of the node's cache dir.
"""

from __future__ import annotations

import json
import subprocess
import sys

from adapters_testlib import REPO, make_files

READER = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
from adapters.torch import AvaIterableDataset
dataset = AvaIterableDataset.from_prefix(sys.argv[1])
print(sum(1 for epoch in range(2) for sample in dataset))
"""


def test_pod_view_reads_the_mount_directly_and_says_why_once(local_bucket, mount, tmp_path):
    keys = make_files(local_bucket, 12)
    mnt = mount(local_bucket.as_uri())
    cache_dir = json.loads(subprocess.run(
        [sys.executable, "-m", "avafs", "status", "--json", str(mnt)], capture_output=True,
        text=True, check=True, timeout=60).stdout)["cache_dir"]
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs none '{cache_dir}' && exec '{sys.executable}' -c '{READER}' '{mnt}'"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(2 * len(keys))
    logged = result.stderr.strip().splitlines()
    assert logged == [f"INFO reading the avafs mount {mnt} directly: its control socket "
                      f"{cache_dir}/control.sock is not visible here (as in a pod's view of a "
                      "CSI volume), so batched reads and prefetch hints are off"]
