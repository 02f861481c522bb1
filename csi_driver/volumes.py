"""The node's volumes: stage, publish and their reverses, each one idempotent and recorded.

One lock per volume serializes everything done to a volume (RPCs and the repair loop), while
different volumes proceed in parallel: starting one volume's daemon can take seconds and
must not hold up another pod's mount.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .daemon import DaemonError, kill_daemon, stop_daemon
from .errors import CsiError, already_exists, failed_precondition, internal, not_found
from .mounts import Health, detach, mount_at, normalize, probe, statvfs
from .reconcile import PathGone, bind_matches, ensure_published, ensure_staged, mount_arguments
from .state import StateDir, TargetRecord, VolumeRecord, path_key
from .volume_spec import Credentials, VolumeSpec, resolve_sub_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Usage:
    unit: str
    total: int
    available: int
    used: int


@dataclass(frozen=True)
class VolumeStats:
    usage: list[Usage]
    abnormal: bool
    message: str


class VolumeManager:
    def __init__(self, state: StateDir, cache_root: Path) -> None:
        self._state = state
        self._cache_root = cache_root
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        """Guards `_locks`, and the check that no other volume is staged at a path."""

    @contextmanager
    def _locked(self, volume_id: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(volume_id, threading.Lock())
        with lock:
            yield

    def _mount_arguments(self, record: VolumeRecord) -> list[str]:
        return mount_arguments(record, str(self._state.namespace_config(record.volume_id)))

    def stage(self, volume_id: str, staging_path: str, spec: VolumeSpec,
              credentials: Credentials | None) -> None:
        with self._locked(volume_id):
            existing = self._state.volume(volume_id)
            if existing is not None:
                if existing.staging_path != staging_path:
                    raise already_exists(f"volume {volume_id} is already staged at "
                                         f"{existing.staging_path}")
                if existing.spec != spec:
                    raise already_exists(f"volume {volume_id} is already staged at "
                                         f"{staging_path} with other volumeAttributes or "
                                         "access mode; unstage it first")
                record = existing
            else:
                with self._guard:
                    for other in self._state.volumes():
                        if other.staging_path == staging_path:
                            raise already_exists(f"staging path {staging_path} is in use by "
                                                 f"volume {other.volume_id}")
                    record = VolumeRecord(volume_id, staging_path, spec,
                                          str(self._cache_root / path_key(volume_id)))
                    self._state.save_volume(record, credentials)
            if existing is not None:
                self._state.save_volume(record, credentials)
            try:
                outcome = ensure_staged(record, self._mount_arguments(record), credentials)
            except PathGone:
                if existing is None:
                    self._state.delete_volume(volume_id)
                raise failed_precondition(f"the parent directory of {staging_path} does not "
                                          "exist") from None
            except (CsiError, OSError):
                if existing is None:
                    self._state.delete_volume(volume_id)
                raise
            log.info("volume %s staged at %s (%s)", volume_id, staging_path, outcome)

    def unstage(self, volume_id: str, staging_path: str) -> None:
        with self._locked(volume_id):
            record = self._state.volume(volume_id)
            if record is None or record.staging_path != staging_path:
                log.info("volume %s is not staged at %s: nothing to do", volume_id, staging_path)
                return
            for target in self._state.targets(volume_id):
                log.warning("volume %s is unstaged while still published at %s; unpublishing",
                            volume_id, target.target_path)
                self._remove_target(volume_id, target.target_path)
            self._unmount_staged(record)
            self._state.delete_volume(volume_id)
            log.info("volume %s unstaged from %s", volume_id, staging_path)

    def _unmount_staged(self, record: VolumeRecord) -> bool:
        """Unmount through the daemon, so its pending writes reach the bucket first; whether
        they did (False leaves them in the cache dir, for the next mount to upload).

        A dead mount is brought back before it is unmounted: the new daemon replays the
        journal of writes the dead one had acknowledged but not yet uploaded.
        """
        health = probe(record.staging_path).health
        if health is Health.DEAD:
            try:
                ensure_staged(record, self._mount_arguments(record),
                              self._state.credentials(record.volume_id))
                health = Health.HEALTHY
            except (CsiError, OSError, PathGone) as error:
                log.error("cannot restart the dead mount of volume %s to flush it (%s); "
                          "writes not yet uploaded stay in %s", record.volume_id,
                          getattr(error, "message", error), record.cache_dir)
        if health is Health.HEALTHY:
            try:
                stop_daemon(record.staging_path)
            except DaemonError as error:
                raise internal(f"avafs umount of volume {record.volume_id} failed: "
                               f"{error}") from None
        elif mount_at(record.staging_path) is not None:
            detach(record.staging_path)
        kill_daemon(record.cache_dir)
        return health is Health.HEALTHY

    def stage_ephemeral(self, volume_id: str, spec: VolumeSpec,
                        credentials: Credentials | None) -> str:
        """Stage an inline volume at the plugin's own staging path, which this returns."""
        staging_path = self._state.ephemeral_staging_path(volume_id)
        os.makedirs(staging_path, mode=0o700, exist_ok=True)
        self.stage(volume_id, staging_path, spec, credentials)
        return staging_path

    def _release_ephemeral(self, record: VolumeRecord) -> None:
        """An inline volume lives as long as its one pod: unmount it when its last target
        goes, and drop its cache, since no later pod has the same volume id."""
        flushed = self._unmount_staged(record)
        self._state.delete_volume(record.volume_id)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(record.staging_path)
        if flushed:
            shutil.rmtree(record.cache_dir, ignore_errors=True)
        log.info("inline volume %s released", record.volume_id)

    def publish(self, volume_id: str, staging_path: str, target_path: str, sub_path: str,
                volume_context: Mapping[str, str], readonly: bool, mount_group: str = "") -> None:
        """`mount_group` is the pod's fsGroup: the one staged mount of the volume serves it
        only if it was staged for the same group (or a `gid` attribute decides)."""
        with self._locked(volume_id):
            record = self._state.volume(volume_id)
            if record is None:
                raise not_found(f"volume {volume_id} is not staged on this node")
            if record.staging_path != staging_path:
                raise not_found(f"volume {volume_id} is staged at {record.staging_path}, "
                                f"not at {staging_path}")
            staged_group = record.spec.options.get("gid")
            if mount_group and "gid" not in volume_context and staged_group != mount_group:
                raise failed_precondition(
                    f"volume {volume_id} is mounted on this node for group {staged_group} "
                    f"and this pod's fsGroup is {mount_group}: pods sharing a volume on a "
                    "node need the same fsGroup, or set the volume attribute gid")
            wanted = TargetRecord(target_path, resolve_sub_path(sub_path, volume_context),
                                  readonly)
            existing = self._state.target(volume_id, target_path)
            if existing is not None and existing != wanted:
                raise already_exists(f"{target_path} is already published with readonly="
                                     f"{existing.readonly} and subPath {existing.sub_path!r}; "
                                     "unpublish it first")
            ensure_staged(record, self._mount_arguments(record),
                          self._state.credentials(volume_id))
            if existing is None:
                self._refuse_foreign_mount(record, wanted)
                self._state.save_target(volume_id, wanted)
            try:
                outcome = ensure_published(record, wanted)
            except (CsiError, OSError, PathGone) as error:
                if existing is None:
                    self._state.delete_target(volume_id, target_path)
                if isinstance(error, PathGone):
                    raise failed_precondition(f"the parent directory of {target_path} does "
                                              "not exist") from None
                raise
            log.info("volume %s published at %s (%s, subPath %r, readonly=%s)", volume_id,
                     target_path, outcome, wanted.sub_path, readonly)

    def _refuse_foreign_mount(self, record: VolumeRecord, target: TargetRecord) -> None:
        """A live mount at a new target is adopted only if it is this very publish.

        Dead mounts are replaced (a publish over a stale mount must succeed), but a live
        mount of something else belongs to someone else.
        """
        state = probe(target.target_path)
        staging = mount_at(record.staging_path)
        if state.health is Health.HEALTHY and state.entry is not None and staging is not None \
                and not bind_matches(state.entry, staging, target):
            raise already_exists(f"{target.target_path} already has a {state.entry.fstype} "
                                 f"mount of {state.entry.source}")

    def unpublish(self, volume_id: str, target_path: str) -> None:
        with self._locked(volume_id):
            self._remove_target(volume_id, target_path)
            log.info("volume %s unpublished from %s", volume_id, target_path)
            self._release_if_unused_ephemeral(volume_id)

    def _release_if_unused_ephemeral(self, volume_id: str) -> None:
        record = self._state.volume(volume_id)
        if record is not None and self._state.is_ephemeral(record) \
                and not self._state.targets(volume_id):
            self._release_ephemeral(record)

    def _remove_target(self, volume_id: str, target_path: str) -> None:
        if mount_at(target_path) is not None:
            detach(target_path)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(target_path)
        except OSError as error:
            raise internal(f"cannot remove {target_path} after unmounting it: "
                           f"{error.strerror}") from None
        self._state.delete_target(volume_id, target_path)

    def stats(self, volume_id: str, volume_path: str) -> VolumeStats:
        record = self._state.volume(volume_id)
        if record is None:
            raise not_found(f"volume {volume_id} is not staged on this node")
        path = normalize(volume_path)
        known = {record.staging_path} | {t.target_path for t in self._state.targets(volume_id)}
        if path not in known:
            raise not_found(f"volume {volume_id} is neither staged nor published at "
                            f"{volume_path}")
        health = probe(path).health
        if health is not Health.HEALTHY:
            return VolumeStats([], True, f"{path} is {health.value}")
        try:
            fs = statvfs(path)
        except (OSError, TimeoutError) as error:
            return VolumeStats([], True, f"statvfs({path}) failed: {error}")
        usage = [Usage("BYTES", fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize,
                       (fs.f_blocks - fs.f_bfree) * fs.f_frsize)]
        if fs.f_files > 0:
            usage.append(Usage("INODES", fs.f_files, fs.f_favail, fs.f_files - fs.f_ffree))
        return VolumeStats(usage, False, "the avafs mount is healthy")

    def repair_all(self) -> None:
        """Adopt live mounts, rebuild dead ones: run at start-up and then periodically."""
        for listed in self._state.volumes():
            with self._locked(listed.volume_id):
                record = self._state.volume(listed.volume_id)
                if record is not None:
                    self._repair(record)

    def _repair(self, record: VolumeRecord) -> None:
        try:
            outcome = ensure_staged(record, self._mount_arguments(record),
                                    self._state.credentials(record.volume_id))
        except PathGone:
            log.warning("the staging directory of volume %s is gone (%s): forgetting the "
                        "volume", record.volume_id, record.staging_path)
            kill_daemon(record.cache_dir)
            self._state.delete_volume(record.volume_id)
            return
        except (CsiError, OSError) as error:
            log.error("cannot repair volume %s at %s: %s", record.volume_id,
                      record.staging_path, getattr(error, "message", error))
            return
        log.log(logging.DEBUG if outcome == "adopted" else logging.WARNING,
                "volume %s at %s: %s", record.volume_id, record.staging_path, outcome)
        for target in self._state.targets(record.volume_id):
            try:
                outcome = ensure_published(record, target)
            except PathGone:
                log.warning("the pod directory of %s is gone: forgetting the target",
                            target.target_path)
                self._state.delete_target(record.volume_id, target.target_path)
                continue
            except (CsiError, OSError) as error:
                log.error("cannot repair %s of volume %s: %s", target.target_path,
                          record.volume_id, getattr(error, "message", error))
                continue
            log.log(logging.DEBUG if outcome == "adopted" else logging.WARNING,
                    "volume %s target %s: %s", record.volume_id, target.target_path, outcome)
        self._release_if_unused_ephemeral(record.volume_id)
