"""What a StorageClass's parameters make of a volume: where it lives and what the node needs.

A provisioned volume is the directory `<bucket>/<name>/` of the bucket the StorageClass names.
Its id is that directory's URL, with the endpoint and region as a query
(`s3://datasets/pvcs/pvc-1f2e?endpointUrl=https%3A%2F%2Fs3.example.com`), because DeleteVolume
gets nothing but the id and secrets and must still find the bucket. What a name was created
with (parameters, capacity) is kept beside the volumes, under `.avafs-csi/volumes/`, where no
pod of a volume sees it: it makes CreateVolume idempotent and tells DeleteVolume whether to
delete or keep the objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

from .errors import invalid_argument
from .state import path_key
from .volume_spec import SWITCH_ATTRIBUTES, VALUE_ATTRIBUTES, parse_volume_context

RESERVED_PREFIX = "csi.storage.k8s.io/"
"""Parameters the external-provisioner reads itself (secret references); never the driver's."""
RECLAIM_CHOICES = ("retain", "delete")
RECORDS = ".avafs-csi/volumes/"
LOCATION_QUERY = ("endpointUrl", "region")
"""Volume attributes DeleteVolume needs to reach the bucket, so the id carries them."""
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def known_parameters() -> list[str]:
    return sorted(["bucket", "reclaim", "subPath", *VALUE_ATTRIBUTES, *SWITCH_ATTRIBUTES])


@dataclass(frozen=True)
class VolumeLocation:
    """Where a provisioned volume's objects are, as its id says."""

    bucket_url: str
    directory: str
    query: dict[str, str]
    """The attributes of LOCATION_QUERY the StorageClass set."""

    @property
    def url(self) -> str:
        return f"{self.bucket_url}/{self.directory}"

    @property
    def prefix(self) -> str:
        return f"{self.directory}/"

    @property
    def record_key(self) -> str:
        return f"{RECORDS}{self.directory}.json"

    def volume_id(self) -> str:
        return self.url + (f"?{urlencode(sorted(self.query.items()))}" if self.query else "")

    @classmethod
    def from_volume_id(cls, volume_id: str) -> VolumeLocation | None:
        """None for an id this controller never made."""
        parts = urlsplit(volume_id)
        bucket_url, _, directory = f"{parts.scheme}://{parts.netloc}{parts.path}".rpartition("/")
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        if parts.scheme not in ("s3", "file") or parts.fragment or not _PLAIN_NAME.fullmatch(
                directory) or set(query) - set(LOCATION_QUERY) or bucket_url.endswith("/"):
            return None
        if parts.scheme == "s3" and not parts.netloc:
            return None
        return cls(bucket_url, directory, query)


@dataclass(frozen=True)
class StorageClassParameters:
    bucket_url: str
    reclaim: str
    attributes: dict[str, str]
    """Volume attributes for the node, as a static volume would set them (no `source`)."""

    def parameters(self) -> dict[str, str]:
        """What a name is created with, as recorded and compared."""
        return {"bucket": self.bucket_url, "reclaim": self.reclaim, **self.attributes}

    def location(self, name: str) -> VolumeLocation:
        """A volume's directory is its name where that is a plain file name (the CO's
        `pvc-<uid>` always is), else a readable name with a hash of the full one."""
        directory = name if _PLAIN_NAME.fullmatch(name) else path_key(name)
        return VolumeLocation(self.bucket_url, directory,
                              {key: self.attributes[key] for key in LOCATION_QUERY
                               if key in self.attributes})

    def volume_context(self, location: VolumeLocation) -> dict[str, str]:
        return {"source": location.url, **self.attributes}


def parse_parameters(parameters: Mapping[str, str]) -> StorageClassParameters:
    """Checked StorageClass parameters; INVALID_ARGUMENT names the first bad one."""
    own = {key: value for key, value in parameters.items() if not key.startswith(RESERVED_PREFIX)}
    unknown = sorted(set(own) - set(known_parameters()))
    if unknown:
        raise invalid_argument(f"unknown StorageClass parameter {unknown[0]!r}; known: "
                               f"{', '.join(known_parameters())}")
    bucket_url = own.pop("bucket", "").strip().rstrip("/")
    if not bucket_url:
        raise invalid_argument("the StorageClass parameter 'bucket' is required: "
                               "s3://bucket[/prefix] (or file:///dir)")
    parts = urlsplit(bucket_url)
    if "?" in bucket_url or "#" in bucket_url or not (
            (parts.scheme == "s3" and parts.netloc)
            or (parts.scheme == "file" and not parts.netloc and parts.path.startswith("/"))):
        raise invalid_argument(f"parameters.bucket: expected s3://bucket[/prefix] or "
                               f"file:///absolute/dir, got {bucket_url!r}")
    reclaim = own.pop("reclaim", "retain").strip().lower()
    if reclaim not in RECLAIM_CHOICES:
        raise invalid_argument(f"parameters.reclaim: expected retain or delete, got {reclaim!r}")
    parsed = StorageClassParameters(bucket_url, reclaim, own)
    parse_volume_context(parsed.volume_context(parsed.location("check")), read_only=False)
    return parsed


def record_body(name: str, parameters: dict[str, str], capacity_bytes: int) -> bytes:
    return json.dumps({"name": name, "parameters": parameters,
                       "capacity_bytes": capacity_bytes}, sort_keys=True).encode()


def read_record(body: bytes) -> tuple[str, dict[str, str], int]:
    """(name, parameters, capacity in bytes) from a record written by `record_body`."""
    data = json.loads(body)
    return data["name"], data["parameters"], data["capacity_bytes"]
