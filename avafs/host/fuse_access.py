"""Whether this user can make a FUSE mount here, checked before the daemon starts.

libfuse reports a refused mount as "fuse_session_mount failed" and writes its reason to the
daemon's stderr, which in the background is the log file: the user would see neither the cause
nor the fix. So what commonly refuses a mount (no /dev/fuse, a /dev/fuse this user may not
open, no libfuse, no fusermount3, `allow_other` that /etc/fuse.conf does not allow a non-root
user) is checked here, as libfuse and fusermount3 would, and named in one line with its fix.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ..errors import AvafsError

FUSE_DEVICE = Path("/dev/fuse")
FUSE_CONF = Path("/etc/fuse.conf")


def check_fuse(allow_other: bool) -> None:
    if not FUSE_DEVICE.exists():
        raise AvafsError(f"{FUSE_DEVICE} not found: load the fuse module (modprobe fuse), or "
                         "give the container --device /dev/fuse")
    _check_device_opens()
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        raise AvafsError("libfuse3 is missing: apt-get install fuse3 libfuse3-3 (or your "
                         "distribution's libfuse 3 package)") from None
    if os.geteuid() == 0:
        return
    if shutil.which("fusermount3") is None:
        raise AvafsError("fusermount3 not found: apt-get install fuse3")
    if allow_other and not _users_may_allow_other():
        raise AvafsError(f"--allow-other needs a line 'user_allow_other' in {FUSE_CONF} when "
                         "a user other than root mounts: add it (as root), or mount without "
                         "--allow-other")


def _check_device_opens() -> None:
    """Open the device as libfuse does first (read and write, as this user); a connection
    opened and closed again without a mount costs the kernel nothing."""
    try:
        os.close(os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC))
    except OSError as error:
        if error.errno == errno.EACCES:
            raise AvafsError(f"cannot open {FUSE_DEVICE}: permission denied for uid "
                             f"{os.geteuid()}: make it usable by every user as it usually is "
                             f"(chmod 0666 {FUSE_DEVICE}, as root), or mount as root") from None
        raise AvafsError(f"cannot open {FUSE_DEVICE}: {os.strerror(error.errno or 0)}: load the "
                         "fuse module (modprobe fuse), or give the container --device "
                         "/dev/fuse") from None


def _users_may_allow_other() -> bool:
    """Whether fusermount3 lets a non-root user mount with `allow_other`: a line
    `user_allow_other` on its own in /etc/fuse.conf (comments and blanks around it allowed)."""
    try:
        lines = FUSE_CONF.read_text().splitlines()
    except OSError:
        return False
    return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in lines)
