"""What a volume is, read from a PersistentVolume's `volumeAttributes` and its secrets.

Attributes use the camelCase spelling of Kubernetes manifests (`diskCache: 100GiB`); each one
maps mechanically to the `avafs mount` flag of the same name (`--disk-cache`). Values are
checked here so that a typo fails NodeStageVolume with a message naming the attribute the user
wrote, instead of a daemon that never comes up. The driver owns the flags that make the
mount work in a cluster (`--cache-dir`, `--allow-other`), so no attribute can set them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import yaml

from avafs.config.options import OPTIONS_BY_NAME
from avafs.config.sizes import parse_size

from .errors import invalid_argument

POD_INFO_PREFIX = "csi.storage.k8s.io/"
"""Keys kubelet adds to the volume context when the CSIDriver has podInfoOnMount: true."""

_SUB_PATH_VARIABLE = re.compile(r"\$\{([^}]*)\}")
SUB_PATH_VARIABLES = {
    "pod.name": POD_INFO_PREFIX + "pod.name",
    "pod.namespace": POD_INFO_PREFIX + "pod.namespace",
    "pod.uid": POD_INFO_PREFIX + "pod.uid",
    "serviceAccount.name": POD_INFO_PREFIX + "serviceAccount.name",
}
"""`${...}` names a subPath may use, and the pod-info key each one is read from."""


def _size(value: str) -> str:
    """Checked by the one size parser of flags and config files (Kubernetes quantities)."""
    parse_size(value)
    return value


def _metrics_address(value: str) -> str:
    OPTIONS_BY_NAME["metrics_addr"].parse(value)
    return value


def _count(value: str) -> str:
    if not value.isdigit():
        raise ValueError("expected a whole number, 0 or more")
    return value


def _fraction(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number <= 1:
        raise ValueError("expected a fraction in (0, 1], such as 0.9")
    return value


def _seconds(value: str) -> str:
    """Checked by the mount option's own parser: seconds, a duration such as 5m, or inf."""
    OPTIONS_BY_NAME["metadata_ttl"].parse(value)
    return value


def _id(value: str) -> str:
    if not value.isdigit() or int(value) >= 2**32 - 1:
        raise ValueError("expected a numeric user or group id, such as 1000")
    return value


def _mode(value: str) -> str:
    if not value or any(digit not in "01234567" for digit in value) or int(value, 8) > 0o777:
        raise ValueError("expected octal permission bits, such as \"0664\"")
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value.lower()
    return check


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("expected an http:// or https:// URL")
    return value


def _text(value: str) -> str:
    if not value.strip() or "\n" in value:
        raise ValueError("expected a single line of text")
    return value


VALUE_ATTRIBUTES: dict[str, Callable[[str], str]] = {
    "blockSize": _size,
    "ramCache": _size,
    "ramCacheFiles": _count,
    "diskCache": _size,
    "diskCacheFiles": _count,
    "highWatermark": _fraction,
    "lowWatermark": _fraction,
    "readAhead": _count,
    "inflightMemory": _size,
    "metadataTtl": _seconds,
    "writeback": _choice("async", "sync"),
    "endpointUrl": _http_url,
    "region": _text,
    "logLevel": _choice("debug", "info", "warning", "error"),
    "uid": _id,
    "gid": _id,
    "fileMode": _mode,
    "dirMode": _mode,
    "metricsAddr": _metrics_address,
}
"""Attributes passed to `avafs mount` as `--flag VALUE`."""

SWITCH_ATTRIBUTES = ("immutable", "readOnly", "listingAttrs")
"""Attributes passed to `avafs mount` as a bare `--flag` when "true"."""

LAYOUT_ATTRIBUTES = ("source", "namespace", "subPath")


def flag_name(attribute: str) -> str:
    """`diskCache` -> `--disk-cache`: attributes are flags' long names in camelCase."""
    return "--" + re.sub(r"([A-Z])", r"-\1", attribute).lower()


def _switch(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise invalid_argument(f"volumeAttributes.{name}: expected true or false, "
                               f"got {value!r}")
    return value.lower() == "true"


def _check_source_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "s3" and parts.netloc:
        return url
    if parts.scheme == "file" and not parts.netloc and parts.path.startswith("/"):
        return url
    raise invalid_argument(f"{where}: expected s3://bucket[/prefix] or file:///absolute/dir, "
                           f"got {url!r}")


def _parse_namespace(text: str) -> dict[str, str]:
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise invalid_argument(f"volumeAttributes.namespace is not valid YAML: "
                               f"{str(error).splitlines()[0]}") from None
    if not isinstance(mapping, dict) or not mapping:
        raise invalid_argument("volumeAttributes.namespace: expected a YAML mapping of "
                               "directory names to source URLs, e.g. '{imagenet: s3://data/in}'")
    namespace: dict[str, str] = {}
    for name, url in mapping.items():
        name = str(name)
        if name in (".", "..") or "/" in name or not name:
            raise invalid_argument(f"volumeAttributes.namespace: {name!r} is not a single "
                                   "directory name")
        if not isinstance(url, str):
            raise invalid_argument(f"volumeAttributes.namespace.{name}: expected a source URL")
        namespace[name] = _check_source_url(url, f"volumeAttributes.namespace.{name}")
    return namespace


def check_sub_path(template: str) -> str:
    """A relative path inside the volume; `${pod.namespace}`-style variables allowed."""
    for variable in _SUB_PATH_VARIABLE.findall(template):
        if variable not in SUB_PATH_VARIABLES:
            raise invalid_argument(f"volumeAttributes.subPath: unknown variable ${{{variable}}}; "
                                   f"known: {', '.join(sorted(SUB_PATH_VARIABLES))}")
    path = PurePosixPath(template)
    if path.is_absolute() or ".." in path.parts or "\0" in template:
        raise invalid_argument(f"volumeAttributes.subPath {template!r} must be a relative path "
                               "inside the volume, without '..'")
    normalized = str(path)
    return "" if normalized == "." else normalized


def resolve_sub_path(template: str, volume_context: Mapping[str, str]) -> str:
    """The subPath with its `${...}` variables replaced from the pod info kubelet sent."""
    def replace(match: re.Match[str]) -> str:
        key = SUB_PATH_VARIABLES[match.group(1)]
        value = volume_context.get(key, "")
        if not value:
            raise invalid_argument(f"volumeAttributes.subPath uses ${{{match.group(1)}}} but the "
                                   f"request has no {key}; set podInfoOnMount: true in the "
                                   "CSIDriver object")
        if "/" in value or value in (".", ".."):
            raise invalid_argument(f"{key} {value!r} cannot be used as a directory name")
        return value
    return check_sub_path(_SUB_PATH_VARIABLE.sub(replace, template))


@dataclass(frozen=True)
class VolumeSpec:
    """How to run the volume's daemon: everything that makes two stages "the same volume"."""

    source: str | None
    namespace: dict[str, str] | None
    options: dict[str, str]
    read_only: bool

    def urls(self) -> list[str]:
        return [self.source] if self.source else sorted((self.namespace or {}).values())

    def mount_flags(self) -> list[str]:
        flags: list[str] = []
        for attribute, value in sorted(self.options.items()):
            if attribute in SWITCH_ATTRIBUTES:
                flags.append(flag_name(attribute))
            else:
                flags += [flag_name(attribute), value]
        if self.read_only:
            flags.append("--read-only")
        return flags

    def to_json(self) -> dict:
        return {"source": self.source, "namespace": self.namespace, "options": self.options,
                "read_only": self.read_only}

    @classmethod
    def from_json(cls, data: dict) -> VolumeSpec:
        return cls(source=data["source"], namespace=data["namespace"],
                   options=dict(data["options"]), read_only=data["read_only"])


def parse_volume_context(context: Mapping[str, str], read_only: bool) -> tuple[VolumeSpec, str]:
    """(the volume's spec, its subPath template) from `volumeAttributes`.

    `read_only` comes from the access mode; `readOnly: "true"` forces it too.
    """
    unknown = sorted(key for key in context
                     if key not in VALUE_ATTRIBUTES and key not in SWITCH_ATTRIBUTES
                     and key not in LAYOUT_ATTRIBUTES and not key.startswith(POD_INFO_PREFIX))
    if unknown:
        known = sorted([*LAYOUT_ATTRIBUTES, *VALUE_ATTRIBUTES, *SWITCH_ATTRIBUTES])
        raise invalid_argument(f"unknown volumeAttributes key {unknown[0]!r}; known keys: "
                               f"{', '.join(known)}")
    source = context.get("source") or None
    namespace_text = context.get("namespace") or None
    if (source is None) == (namespace_text is None):
        raise invalid_argument("volumeAttributes must set exactly one of 'source' (a URL) and "
                               "'namespace' (a YAML mapping of directory names to URLs)")
    if source is not None:
        _check_source_url(source, "volumeAttributes.source")
    namespace = _parse_namespace(namespace_text) if namespace_text is not None else None

    options: dict[str, str] = {}
    for name, check in VALUE_ATTRIBUTES.items():
        if name in context:
            try:
                options[name] = check(context[name].strip())
            except ValueError as error:
                raise invalid_argument(f"volumeAttributes.{name}: {error}, "
                                       f"got {context[name]!r}") from None
    for name in ("immutable", "listingAttrs"):
        if name in context and _switch(name, context[name]):
            options[name] = "true"
    if "readOnly" in context and _switch("readOnly", context["readOnly"]):
        read_only = True
    spec = VolumeSpec(source=source, namespace=namespace, options=options, read_only=read_only)
    return spec, check_sub_path(context.get("subPath", ""))


FS_GROUP_MODES = {"fileMode": "0664", "dirMode": "0775"}
"""What kubelet would make of a volume for a pod's fsGroup (group-owned, group-writable), for
modes the volume's attributes leave unset."""


def with_mount_group(spec: VolumeSpec, group: str) -> VolumeSpec:
    """The spec for a pod whose fsGroup kubelet delegates to the driver (`volume_mount_group`):
    files owned by that group and writable by it, unless `gid` is a volume attribute, which
    wins."""
    if not group or "gid" in spec.options:
        return spec
    try:
        _id(group)
    except ValueError:
        raise invalid_argument(f"volume_capability.mount.volume_mount_group: expected a "
                               f"numeric group id, got {group!r}") from None
    return replace(spec, options={**FS_GROUP_MODES, **spec.options, "gid": group})


SECRET_KEYS = {
    "accessKeyId": "AWS_ACCESS_KEY_ID",
    "secretAccessKey": "AWS_SECRET_ACCESS_KEY",
    "sessionToken": "AWS_SESSION_TOKEN",
}


@dataclass(frozen=True)
class Credentials:
    """S3 credentials of one volume; their values never appear in a repr or a log line."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def environment(self) -> dict[str, str]:
        env = {"AWS_ACCESS_KEY_ID": self.access_key_id,
               "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.session_token:
            env["AWS_SESSION_TOKEN"] = self.session_token
        return env

    def to_json(self) -> dict:
        return {"access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key,
                "session_token": self.session_token}

    @classmethod
    def from_json(cls, data: dict) -> Credentials:
        return cls(data["access_key_id"], data["secret_access_key"], data["session_token"])


def parse_credentials(secrets: Mapping[str, str]) -> Credentials | None:
    """Credentials from the node-stage secrets; None means "use the node's own AWS chain"."""
    unknown = sorted(set(secrets) - set(SECRET_KEYS))
    if unknown:
        raise invalid_argument(f"unknown key {unknown[0]!r} in the volume's secret; expected "
                               "accessKeyId and secretAccessKey, and optionally sessionToken")
    if not secrets:
        return None
    missing = [key for key in ("accessKeyId", "secretAccessKey") if not secrets.get(key)]
    if missing:
        raise invalid_argument(f"the volume's secret has no {missing[0]}; accessKeyId and "
                               "secretAccessKey go together")
    return Credentials(secrets["accessKeyId"], secrets["secretAccessKey"],
                       secrets.get("sessionToken") or None)
