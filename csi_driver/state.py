"""The driver's memory across restarts: what is staged and published, as small JSON files.

Kubelet never repeats a NodeStageVolume or NodePublishVolume for a pod that is already
running, so after a crash the state directory is the only place that says which daemon to
restart with which options and which bind mounts to re-establish. Records are written before
the mount they describe (an intent log): a driver killed half-way finds the record and
finishes or repairs the job. Every file is replaced atomically (write, fsync, rename), so a
crash never leaves half a record.

Layout (the directory is root-only, 0700; files are 0600):

    volumes/<volume key>/volume.json         VolumeRecord
    volumes/<volume key>/credentials.json    the stage secrets, needed to restart the daemon
    volumes/<volume key>/namespace.yaml      avafs config for a `namespace` volume
    volumes/<volume key>/targets/<key>.json  TargetRecord, one per published target path
    ephemeral/<volume key>/                   the staging mount of an inline (ephemeral) volume

Kubelet sends secrets with NodeStageVolume only, never again, so a daemon restarted during
recovery can only get its credentials from `credentials.json`; that file is the single place
where they rest on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from .volume_spec import Credentials, VolumeSpec


def path_key(text: str) -> str:
    """A file name for an arbitrary string: readable prefix, collision-free hash suffix."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:40]
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{readable}-{digest}" if readable else digest


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@dataclass(frozen=True)
class VolumeRecord:
    volume_id: str
    staging_path: str
    spec: VolumeSpec
    cache_dir: str

    def to_json(self) -> dict:
        return {"volume_id": self.volume_id, "staging_path": self.staging_path,
                "spec": self.spec.to_json(), "cache_dir": self.cache_dir}

    @classmethod
    def from_json(cls, data: dict) -> VolumeRecord:
        return cls(volume_id=data["volume_id"], staging_path=data["staging_path"],
                   spec=VolumeSpec.from_json(data["spec"]), cache_dir=data["cache_dir"])


@dataclass(frozen=True)
class TargetRecord:
    target_path: str
    sub_path: str
    readonly: bool

    def to_json(self) -> dict:
        return {"target_path": self.target_path, "sub_path": self.sub_path,
                "readonly": self.readonly}

    @classmethod
    def from_json(cls, data: dict) -> TargetRecord:
        return cls(target_path=data["target_path"], sub_path=data["sub_path"],
                   readonly=data["readonly"])


class StateDir:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)
        self._volumes = root / "volumes"
        self._ephemeral = root / "ephemeral"

    def _volume_dir(self, volume_id: str) -> Path:
        return self._volumes / path_key(volume_id)

    def volume(self, volume_id: str) -> VolumeRecord | None:
        path = self._volume_dir(volume_id) / "volume.json"
        if not path.exists():
            return None
        return VolumeRecord.from_json(json.loads(path.read_text()))

    def volumes(self) -> list[VolumeRecord]:
        records = []
        for path in sorted(self._volumes.glob("*/volume.json")):
            try:
                records.append(VolumeRecord.from_json(json.loads(path.read_text())))
            except FileNotFoundError:
                continue
        return records

    def save_volume(self, record: VolumeRecord, credentials: Credentials | None) -> None:
        directory = self._volume_dir(record.volume_id)
        if credentials is not None:
            write_atomically(directory / "credentials.json",
                             json.dumps(credentials.to_json()).encode())
        else:
            (directory / "credentials.json").unlink(missing_ok=True)
        if record.spec.namespace is not None:
            write_atomically(self.namespace_config(record.volume_id),
                             yaml.safe_dump({"namespace": record.spec.namespace}).encode())
        write_atomically(directory / "volume.json",
                         json.dumps(record.to_json(), indent=1).encode())

    def credentials(self, volume_id: str) -> Credentials | None:
        path = self._volume_dir(volume_id) / "credentials.json"
        if not path.exists():
            return None
        return Credentials.from_json(json.loads(path.read_text()))

    def namespace_config(self, volume_id: str) -> Path:
        return self._volume_dir(volume_id) / "namespace.yaml"

    def delete_volume(self, volume_id: str) -> None:
        shutil.rmtree(self._volume_dir(volume_id), ignore_errors=True)

    def ephemeral_staging_path(self, volume_id: str) -> str:
        """Where the plugin stages an inline volume itself: kubelet stages only persistent
        volumes, and gives an inline one no staging path."""
        return str(self._ephemeral / path_key(volume_id))

    def is_ephemeral(self, record: VolumeRecord) -> bool:
        return Path(record.staging_path).parent == self._ephemeral

    def _target_file(self, volume_id: str, target_path: str) -> Path:
        return self._volume_dir(volume_id) / "targets" / f"{path_key(target_path)}.json"

    def targets(self, volume_id: str) -> list[TargetRecord]:
        directory = self._volume_dir(volume_id) / "targets"
        return [TargetRecord.from_json(json.loads(path.read_text()))
                for path in sorted(directory.glob("*.json"))]

    def target(self, volume_id: str, target_path: str) -> TargetRecord | None:
        path = self._target_file(volume_id, target_path)
        if not path.exists():
            return None
        return TargetRecord.from_json(json.loads(path.read_text()))

    def save_target(self, volume_id: str, record: TargetRecord) -> None:
        write_atomically(self._target_file(volume_id, record.target_path),
                         json.dumps(record.to_json()).encode())

    def delete_target(self, volume_id: str, target_path: str) -> None:
        self._target_file(volume_id, target_path).unlink(missing_ok=True)
