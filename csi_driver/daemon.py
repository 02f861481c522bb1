"""Starting and stopping a volume's avafs daemon through the `avafs` command line.

The CLI is avafs's public contract: `avafs mount` returns only once the mount is usable (or
with a one-line reason), and the daemon it leaves behind runs in its own session, so it
outlives the driver: a driver restart does not take the pods' data away. Credentials travel
in the daemon's environment only; its command line is readable by every user on the node
(/proc/PID/cmdline), its environment only by root.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from avafs.config.cache_dir import PID_FILE

from .volume_spec import SECRET_KEYS, Credentials

log = logging.getLogger(__name__)

AVAFS = [sys.executable, "-m", "avafs"]
MOUNT_TIMEOUT = 110.0
"""Below kubelet's 2-minute deadline for a CSI call, so the error reaches the user."""
UMOUNT_TIMEOUT = 110.0


class DaemonError(Exception):
    """`avafs mount` or `avafs umount` failed; the message is avafs's own one-line error."""


def daemon_environment(credentials: Credentials | None) -> dict[str, str]:
    """The driver's environment, with the volume's credentials in place of any others.

    Without secrets the daemon keeps the node's own AWS credential chain (instance profile,
    web identity, or variables given to the driver).
    """
    env = dict(os.environ)
    if credentials is not None:
        for variable in SECRET_KEYS.values():
            env.pop(variable, None)
        env.update(credentials.environment())
    return env


def _run(arguments: list[str], env: dict[str, str], timeout: float) -> None:
    """Run an avafs command; its stderr goes to a file, never a pipe the daemon could inherit."""
    with tempfile.TemporaryFile() as errors:
        try:
            result = subprocess.run(AVAFS + arguments, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=errors, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DaemonError(f"'avafs {arguments[0]}' did not finish within "
                              f"{timeout:.0f}s") from None
        if result.returncode != 0:
            errors.seek(0)
            lines = errors.read().decode(errors="replace").strip().splitlines()
            reason = lines[-1] if lines else f"exit status {result.returncode}"
            raise DaemonError(reason)


def start_daemon(mount_arguments: list[str], mountpoint: str, cache_dir: str,
                 credentials: Credentials | None) -> None:
    """`avafs mount ARGS MOUNTPOINT --cache-dir DIR --allow-other`; pods run as any uid."""
    Path(cache_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    _run(["mount", *mount_arguments, mountpoint, "--cache-dir", cache_dir, "--allow-other"],
         daemon_environment(credentials), MOUNT_TIMEOUT)


def stop_daemon(mountpoint: str) -> None:
    """`avafs umount`: flushes pending writes, unmounts and waits for the daemon to exit."""
    _run(["umount", mountpoint], dict(os.environ), UMOUNT_TIMEOUT)


def daemon_pid(cache_dir: str) -> int | None:
    """The pid of the daemon serving `cache_dir`, if that process is still an avafs daemon."""
    try:
        pid = int((Path(cache_dir) / PID_FILE).read_text().strip())
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if b"avafs" in command_line and cache_dir.encode() in command_line:
        return pid
    return None


def kill_daemon(cache_dir: str) -> None:
    """End a daemon whose mount is gone, so a new one can take the cache dir's lock.

    SIGTERM first: the daemon's own handler leaves its journal consistent.
    """
    pid = daemon_pid(cache_dir)
    if pid is None:
        return
    log.warning("stopping leftover avafs daemon %d of cache dir %s", pid, cache_dir)
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if daemon_pid(cache_dir) != pid:
                return
            time.sleep(0.05)
