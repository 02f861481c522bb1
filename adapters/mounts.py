"""Finds the avafs mount under a dataset path, through `avafs.client`, the core's public face.

`avafs.client` is imported only when a mount is actually needed, so datasets over plain local
directories (`require_mount=False`) work without a daemon, and so importing the adapters never
drags in the filesystem's own dependencies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from avafs.client import Client

log = logging.getLogger(__name__)
_read_directly: set[Path] = set()
"""Mounts already said to be read directly, so a process says it once per mount."""


def client_for(path: str | os.PathLike[str], *, require_mount: bool) -> Client | None:
    """The client of the mount holding `path`; None when allowed to be outside any mount, and
    where the mount's control socket is not visible (a pod's view of a CSI volume: the mount
    is bound in, the daemon's cache dir is not), since the mount is then read directly."""
    from avafs.client import Client, NotAnAvafsMount

    try:
        client = Client.for_path(path)
    except NotAnAvafsMount as error:
        if require_mount:
            raise NotAnAvafsMount(
                f"{error} (pass require_mount=False to read a plain local directory)") from None
        return None
    if client.control_visible:
        return client
    if client.mountpoint not in _read_directly:
        _read_directly.add(client.mountpoint)
        log.info("reading the avafs mount %s directly: its control socket %s is not visible "
                 "here (as in a pod's view of a CSI volume), so batched reads and prefetch "
                 "hints are off", client.mountpoint, client.socket)
    return None


def manifest_root(manifest: str | os.PathLike[str],
                  root: str | os.PathLike[str] | None) -> str | os.PathLike[str]:
    """Manifest paths are relative to the mount root; by default, the mount holding the manifest."""
    if root is not None:
        return root
    client = client_for(Path(manifest).absolute(), require_mount=False)
    if client is None:
        raise ValueError(f"{manifest} is not inside an avafs mount: pass root= (the directory its "
                         "\"path\" entries are relative to)")
    return client.mountpoint


def check_snapshot(path: str | os.PathLike[str], snapshot: str) -> None:
    """Raise ValueError unless `path` is in a mount serving snapshot `snapshot` (`avafs mount
    ... --snapshot NAME`): such a mount shows exactly the recorded tree, so a dataset's sample
    list, listed from it, is the snapshot's. The mount's daemon says what it serves, so its
    control socket must be visible here."""
    client = client_for(path, require_mount=True)
    if client is None:
        raise ValueError(f"cannot tell which snapshot {path} serves: the mount's control socket "
                         "is not visible here (a pod's view of a CSI volume)")
    served = client.status().get("snapshot")
    if served is None or served["name"] != snapshot:
        now = "the source as it is now" if served is None else f"snapshot {served['name']!r}"
        raise ValueError(f"{path} is in a mount of {now}, not of snapshot {snapshot!r}: mount "
                         f"it with 'avafs mount SOURCE MOUNTPOINT --snapshot {snapshot}'")


def same_snapshot(state: Mapping[str, Any], snapshot: str | None) -> None:
    """Raise ValueError where a saved state was read from another snapshot than this
    dataset's (or from the live source while this one reads a snapshot, or the reverse)."""
    saved = state.get("snapshot")
    if saved != snapshot:
        def name(which: str | None) -> str:
            return "the source as it was" if which is None else f"snapshot {which!r}"
        raise ValueError(f"state was saved reading {name(saved)}, this dataset reads "
                         f"{name(snapshot)}: resume on the same data")
