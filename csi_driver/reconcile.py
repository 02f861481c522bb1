"""Make the kernel's mounts match the driver's records: adopt what lives, rebuild what died.

One code path serves a first NodeStageVolume, a repeated one, a publish over a stale target,
the driver's start-up and the periodic repair: "make this record true". That is why a
recovery needs no special case: after a crash the records are the same, only the kernel's
side differs.
"""

from __future__ import annotations

import logging
import os

from .daemon import DaemonError, kill_daemon, start_daemon
from .errors import already_exists, internal, not_found
from .mounts import AVAFS_FSTYPE, Health, MountEntry, bind_mount, detach, mount_at, probe
from .state import TargetRecord, VolumeRecord
from .volume_spec import Credentials

log = logging.getLogger(__name__)


class PathGone(Exception):
    """The directory above a staging or target path no longer exists: kubelet removed it."""


def mount_arguments(record: VolumeRecord, namespace_config: str) -> list[str]:
    """The source part of `avafs mount`: a URL, or `--config FILE` for a namespace."""
    flags = [*record.spec.mount_flags(), "--mount-name", record.volume_id]
    if record.spec.namespace is not None:
        return ["--config", namespace_config, *flags]
    assert record.spec.source is not None
    return [record.spec.source, *flags]


def _make_directory(path: str) -> None:
    """Create a staging or target directory, but never its parent.

    A missing parent means kubelet tore the pod's (or volume's) directory down; recreating
    it would resurrect a path kubelet believes is gone.
    """
    if not os.path.isdir(os.path.dirname(path)):
        raise PathGone(path)
    os.makedirs(path, exist_ok=True)


def ensure_staged(record: VolumeRecord, mount_args: list[str],
                  credentials: Credentials | None) -> str:
    """Have a live avafs mount at the staging path; returns what was done, for the log."""
    path = record.staging_path
    state = probe(path)
    if state.health is Health.HEALTHY:
        assert state.entry is not None
        if state.entry.fstype != AVAFS_FSTYPE:
            raise already_exists(f"staging path {path} already has a {state.entry.fstype} "
                                 "mount the driver did not make")
        return "adopted"
    if state.health is Health.UNRESPONSIVE:
        raise internal(f"the avafs mount at {path} is {state.health.value}; not touching it")
    if state.health is Health.DEAD:
        log.warning("avafs mount at %s is dead; detaching it and restarting its daemon", path)
        detach(path)
    if state.health is Health.ABSENT:
        _make_directory(path)
    kill_daemon(record.cache_dir)
    try:
        start_daemon(mount_args, path, record.cache_dir, credentials)
    except DaemonError as error:
        raise internal(f"avafs mount of volume {record.volume_id} failed: {error}") from None
    return "restarted" if state.health is Health.DEAD else "mounted"


def bind_matches(entry: MountEntry, staging: MountEntry, target: TargetRecord) -> bool:
    """Whether `entry` is a bind of `target.sub_path` from the staging mount `staging`."""
    expected_root = os.path.normpath(os.path.join(staging.root, target.sub_path))
    return (entry.device == staging.device and entry.root == expected_root
            and entry.read_only == target.readonly)


def ensure_published(volume: VolumeRecord, target: TargetRecord) -> str:
    """Have a bind of the volume's subPath at the target, from the live staging mount.

    A bind taken from an earlier (now dead) FUSE mount shows the old device number, so it is
    replaced even when it happens to answer.
    """
    staging = mount_at(volume.staging_path)
    if staging is None:
        raise internal(f"volume {volume.volume_id} is not mounted at {volume.staging_path}")
    source = os.path.normpath(os.path.join(volume.staging_path, target.sub_path))
    state = probe(target.target_path)
    if state.health is Health.HEALTHY:
        assert state.entry is not None
        if bind_matches(state.entry, staging, target):
            return "adopted"
    if state.health is Health.UNRESPONSIVE:
        raise internal(f"the mount at {target.target_path} is {state.health.value}")
    if not os.path.isdir(source):
        raise not_found(f"subPath {target.sub_path!r} does not exist in volume "
                        f"{volume.volume_id}")
    if state.entry is not None:
        detach(target.target_path)
    if state.health is Health.ABSENT:
        _make_directory(target.target_path)
    try:
        bind_mount(source, target.target_path, target.readonly)
    except OSError as error:
        raise internal(f"bind mount of {source} on {target.target_path} failed: "
                       f"{error.strerror}") from None
    return "rebound" if state.entry is not None else "bound"

