"""`avafs umount` while another mount namespace holds a copy of the mount.

A mount namespace made while a FUSE mount exists (`unshare --mount`, a service with a private
/tmp) keeps a copy of it, and the kernel ends the FUSE session only when the last copy goes.
The daemon ends its session once its own namespace has no mount of it left; before, `avafs
umount` waited for the other namespace to go, up to its 120 s limit, with the daemon still
holding the cache dir's lock.
"""

from __future__ import annotations

import os
import subprocess
import time

from support import run_avafs


def _wait_for_namespace(pid: int) -> None:
    """Returns once process `pid` runs in a mount namespace of its own (unshare has made it)."""
    ours = os.readlink("/proc/self/ns/mnt")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{pid}/ns/mnt") == ours:
        assert time.monotonic() < deadline, "unshare made no mount namespace"
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_umount_does_not_wait_for_a_copy_in_another_namespace(mount, local_bucket):
    (local_bucket / "sample.bin").write_bytes(b"sample")
    mountpoint = mount(local_bucket.as_uri(), "--read-only")
    daemon = int(os.getxattr(mountpoint, "user.avafs.pid"))
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                               "sleep", "300"])
    try:
        _wait_for_namespace(holder.pid)
        started = time.monotonic()
        result = run_avafs("umount", str(mountpoint), timeout=60)
        assert result.returncode == 0, result.stderr
        while _running(daemon):
            assert time.monotonic() - started < 30, "the daemon still serves the copy"
            time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()
