"""Mount options: one table that drives the CLI flags, the YAML config keys and validation.

Flags and config keys are a public interface (README.md, "Mounting"): a config key is a flag's
long name with dashes as underscores. Keeping both generated from `MOUNT_OPTIONS` means they can
never drift apart, and every value is validated by the same parser whichever way it arrived.
"""

from __future__ import annotations

import grp
import math
import pwd
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import AvafsError
from .cache_dir import default_cache_dir, log_path
from .durations import parse_duration, positive_duration
from .sizes import decimal_letter_warning, parse_size


def _size(value: Any) -> int:
    return parse_size(value)


def _positive_size(value: Any) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"must be larger than 0, got {value!r}")
    return size


def _number(value: Any) -> float:
    """`value` as a number, NaN if it is none: callers say what they expected, never
    Python's "could not convert string to float"."""
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _fraction(value: Any) -> float:
    number = _number(value)
    if not 0 < number <= 1:
        raise ValueError(f"must be a fraction in (0, 1], got {value!r}")
    return number


def _seconds(value: Any) -> float:
    number = parse_duration(value)
    if number < 0:
        raise ValueError(f"must be 0 or more seconds (or inf), got {value!r}")
    return number


def _count(value: Any) -> int:
    number = _number(value)
    if not (math.isfinite(number) and number >= 0 and number == int(number)):
        raise ValueError(f"must be a whole number 0 or more, got {value!r}")
    return int(number)


def _positive_count(value: Any) -> int:
    number = _count(value)
    if number == 0:
        raise ValueError("must be at least 1")
    return number


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def _id(value: Any, kind: str, lookup: Callable[[str], int]) -> int:
    """A numeric id, or a name this machine's user or group database resolves (`lookup`)."""
    if isinstance(value, str) and not value.strip().isdigit():
        try:
            return lookup(value.strip())
        except KeyError:
            raise ValueError(f"unknown {kind} {value!r}: give a {kind} name this machine knows "
                             f"(getent {'passwd' if kind == 'user' else 'group'}) or a numeric "
                             "id") from None
    number = _count(value)
    if number >= 2**32 - 1:
        raise ValueError(f"must be a {kind} name or an id below 4294967295, got {value!r}")
    return number


def _uid(value: Any) -> int:
    return _id(value, "user", lambda name: pwd.getpwnam(name).pw_uid)


def _gid(value: Any) -> int:
    return _id(value, "group", lambda name: grp.getgrnam(name).gr_gid)


def _mode(value: Any) -> int:
    """Octal permission bits as text ("0644", "644"); a YAML number is refused, because YAML
    reads 0644 as octal but 644 as decimal, and a mode must not depend on a leading zero."""
    text = value.strip().lower().removeprefix("0o") if isinstance(value, str) else ""
    if not text or any(digit not in "01234567" for digit in text) or int(text, 8) > 0o777:
        raise ValueError(f"must be octal permission bits between 000 and 777, such as 0644 "
                         f"(quoted in YAML), got {value!r}")
    return int(text, 8)


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {value!r}")
        return text
    return parse


def _text(value: Any) -> str:
    return str(value)


def _endpoint(value: Any) -> str:
    """An http(s) URL; `host:port` alone (as MinIO's docs write it) gets the URL to use."""
    text = str(value).strip()
    parts = urlsplit(text)
    if parts.scheme in ("http", "https") and parts.netloc:
        return text
    if "://" not in text:
        raise ValueError(f"expected an http:// or https:// URL, got {text!r} (did you mean "
                         f"http://{text}?)")
    raise ValueError(f"expected an http:// or https:// URL, got {text!r}")


def _cluster_url(value: Any) -> str:
    text = str(value).strip()
    parts = urlsplit(text)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"expected s3://BUCKET[/prefix], got {text!r}")
    return text


def _etcd_urls(value: Any) -> tuple[str, ...]:
    """`http://HOST:PORT[,http://HOST:PORT...]`: client URLs of one etcd cluster's members."""
    urls = tuple(part.strip() for part in str(value).split(",") if part.strip())
    if not urls:
        raise ValueError("expected one or more http://HOST:PORT URLs of etcd, comma separated")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise ValueError(f"expected http://HOST:PORT (an etcd client URL), got {url!r}")
    return urls


def _node_name(value: Any) -> str:
    text = str(value).strip()
    if not text or any(not (char.isalnum() or char in "._-") for char in text):
        raise ValueError(f"must be letters, digits, '.', '_' or '-', got {value!r}")
    return text


def _lease_ttl(value: Any) -> int:
    number = parse_duration(value)
    if not (2 <= number < math.inf and number == int(number)):
        raise ValueError(f"must be 2 or more whole seconds (etcd's shortest lease), got {value!r}")
    return int(number)


_SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def snapshot_name(value: Any) -> str:
    """A snapshot's name: the last part of a key and a command-line argument, so letters,
    digits, '.', '_' and '-', at most 128, starting with a letter or digit."""
    text = str(value)
    if not _SNAPSHOT_NAME.fullmatch(text):
        raise ValueError(f"must be a snapshot name: letters, digits, '.', '_' and '-' (at most "
                         f"128, starting with a letter or digit), got {text!r}")
    return text


def _address(value: Any) -> tuple[str, int]:
    host, separator, port = str(value).rpartition(":")
    if not separator or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:9100, got {value!r}")
    return host or "0.0.0.0", int(port)


@dataclass(frozen=True)
class OptionSpec:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    is_flag: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


MOUNT_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("cache_dir", _text, None, "directory of the disk tier, its index, the log and "
               "the control socket (default: one per source and block size under "
               "~/.cache/avafs, or /var/cache/avafs as root)", metavar="DIR"),
    OptionSpec("block_size", _positive_size, 4 * 2**20, "size of a cached block (default 4Mi)",
               metavar="SIZE"),
    OptionSpec("ram_cache", _size, 2**30, "RAM tier size (default 1Gi; 0 disables it)", metavar="SIZE"),
    OptionSpec("ram_cache_files", _positive_count, 200_000,
               "most blocks the RAM tier holds (default 200000)", metavar="N"),
    OptionSpec("disk_cache", _size, 10 * 2**30, "disk tier size (default 10Gi)", metavar="SIZE"),
    OptionSpec("disk_cache_files", _positive_count, 1_000_000,
               "most files the disk tier holds (default 1000000)", metavar="N"),
    OptionSpec("high_watermark", _fraction, 0.90,
               "usage fraction of a tier that starts background eviction (default 0.90)", metavar="F"),
    OptionSpec("low_watermark", _fraction, 0.75,
               "usage fraction background eviction stops at (default 0.75)", metavar="F"),
    OptionSpec("cache_policy", _choice("lru", "dataset"), "lru",
               "disk and RAM tier policy: lru, or dataset (keeps the blocks read most often, for "
               "datasets larger than the tiers read in shuffled epochs; default lru)",
               metavar="POLICY"),
    OptionSpec("read_ahead", _count, 8,
               "blocks streamed ahead of a sequential reader; the window doubles while it stays "
               "sequential (default 8; 0 disables)", metavar="N"),
    OptionSpec("inflight_memory", _positive_size, 256 * 2**20,
               "bound on memory held by fetches in flight, read-ahead included (default 256Mi)",
               metavar="SIZE"),
    OptionSpec("metadata_ttl", _seconds, 60.0,
               "seconds listings and attributes are trusted before revalidation (default 60; inf)",
               metavar="SECONDS"),
    OptionSpec("immutable", _flag, False,
               "the data never changes: cache metadata forever, never revalidate", is_flag=True),
    OptionSpec("read_only", _flag, False, "refuse every write with EROFS", is_flag=True),
    OptionSpec("snapshot", snapshot_name, None,
               "serve the source as snapshot NAME recorded it ('avafs snapshot create'), "
               "read-only (default: the source as it is now)", metavar="NAME"),
    OptionSpec("noexec", _flag, False, "refuse to run programs from the mount (mount's noexec, "
               "which fstab's user and users imply)", is_flag=True),
    OptionSpec("writeback", _choice("async", "sync", "cluster"), "async",
               "async: upload after close; sync: close waits for the upload; cluster: close "
               "waits until the file is staged in the --cluster-cache store and queued in "
               "--etcd, so another node uploads it if this one is lost (default async)",
               metavar="MODE"),
    OptionSpec("writeback_delay", _seconds, 1.0,
               "seconds after the last close before a file is uploaded (default 1)",
               metavar="SECONDS"),
    OptionSpec("dirty_high_watermark", _fraction, 0.5,
               "share of the disk tier dirty data may use before writers are slowed and uploads "
               "run eagerly (default 0.5)", metavar="F"),
    OptionSpec("upload_concurrency", _positive_count, 16,
               "files uploaded at once (default 16; their memory is bounded apart, 256 MiB)",
               metavar="N"),
    OptionSpec("endpoint_url", _endpoint, None,
               "S3 endpoint (default: AWS_ENDPOINT_URL or AWS itself)", metavar="URL"),
    OptionSpec("region", _text, None, "S3 region (default: the AWS configuration's)", metavar="REGION"),
    OptionSpec("profile", _text, None,
               "AWS profile (in ~/.aws/config or ~/.aws/credentials) with the sources' "
               "credentials (default: the AWS chain: AWS_PROFILE, AWS_* variables, the "
               "default profile, an instance role)", metavar="PROFILE"),
    OptionSpec("store_timeout", positive_duration, 5.0,
               "seconds an S3 request without data (LIST, HEAD, DELETE) may take before it is "
               "retried; also how long a lookup in a directory never listed waits for a store "
               "that does not answer (default 5)", metavar="SECONDS"),
    OptionSpec("store_min_rate", _positive_size, 2**20,
               "slowest transfer rate, per second, before an S3 data request is abandoned and "
               "retried: a request of N bytes gets --store-timeout + N/RATE seconds in all, "
               "its body included, however the store spaces its bytes; a read fails after two "
               "such tries (default 1MiB)", metavar="SIZE"),
    OptionSpec("cluster_cache", _cluster_url, None,
               "a bucket of an S3-compatible store inside the cluster (SeaweedFS, MinIO) shared "
               "by every node as a third tier between the disk tier and the source (default: "
               "off)", metavar="s3://BUCKET[/PREFIX]"),
    OptionSpec("cluster_endpoint_url", _endpoint, None,
               "endpoint of the --cluster-cache store", metavar="URL"),
    OptionSpec("cluster_profile", _text, None,
               "AWS profile with the --cluster-cache store's credentials (default: "
               "AVAFS_CLUSTER_ACCESS_KEY_ID/_SECRET_ACCESS_KEY, else the source's)",
               metavar="PROFILE"),
    OptionSpec("cluster_timeout", positive_duration, 1.0,
               "seconds a --cluster-cache request without data may take before the block is "
               "read from the source instead; a block's transfer gets its time on top "
               "(default 1)", metavar="SECONDS"),
    OptionSpec("etcd", _etcd_urls, None,
               "etcd client URLs of the cluster (--writeback cluster): leases, queues and "
               "take-overs", metavar="URL[,URL...]"),
    OptionSpec("node_name", _node_name, None,
               "this node's name in the cluster, which names its upload queue (default: the "
               "host name)", metavar="NAME"),
    OptionSpec("cluster_lease_ttl", _lease_ttl, 10,
               "seconds after a node stops answering etcd before another node takes over its "
               "uploads (default 10)", metavar="SECONDS"),
    OptionSpec("cluster_staging_limit", _size, 0,
               "bytes of files this node may have staged in the cluster store and not yet "
               "uploaded before writers are slowed, as past the dirty watermark (default 0: "
               "no limit)", metavar="SIZE"),
    OptionSpec("allow_other", _flag, False, "let users other than the mounting one use the mount",
               is_flag=True),
    OptionSpec("uid", _uid, None, "owner of files and directories whose object names none, a user "
               "name or id (default: the mounting user)", metavar="USER"),
    OptionSpec("gid", _gid, None, "group of files and directories whose object names none, a group "
               "name or id (default: the mounting user's group)", metavar="GROUP"),
    OptionSpec("file_mode", _mode, 0o644, "permissions of files whose object names none "
               "(default 0644)", metavar="MODE"),
    OptionSpec("dir_mode", _mode, 0o755, "permissions of directories (default 0755)",
               metavar="MODE"),
    OptionSpec("listing_attrs", _flag, False,
               "take attributes from listings alone: no HEAD per file on its first stat, "
               "mtimes are the store's write times and modes/owners the defaults (datasets)",
               is_flag=True),
    OptionSpec("metrics_addr", _address, None,
               "serve Prometheus metrics on HOST:PORT (default: off)", metavar="HOST:PORT"),
    OptionSpec("mount_name", _text, None,
               "the 'mount' label of every metric (default: the mountpoint; the CSI driver "
               "gives the volume id)", metavar="NAME"),
    OptionSpec("log_level", _choice("debug", "info", "warning", "error"), "info",
               "log verbosity (default info)", metavar="LEVEL"),
    OptionSpec("log_file", _text, None, "the daemon's log (default: avafs.log in the cache "
               "dir)", metavar="FILE"),
)
OPTIONS_BY_NAME = {spec.name: spec for spec in MOUNT_OPTIONS}


@dataclass(frozen=True)
class MountOptions:
    """Validated options of one mount; `sources` maps a top-level directory to a URL.

    A single-source mount has the one key "" (the source is the mount's root).
    """

    sources: dict[str, str]
    cache_dir: Path
    block_size: int
    ram_cache: int
    ram_cache_files: int
    disk_cache: int
    disk_cache_files: int
    high_watermark: float
    low_watermark: float
    cache_policy: str
    read_ahead: int
    inflight_memory: int
    metadata_ttl: float
    immutable: bool
    read_only: bool
    snapshot: str | None
    noexec: bool
    writeback: str
    writeback_delay: float
    dirty_high_watermark: float
    upload_concurrency: int
    endpoint_url: str | None
    region: str | None
    profile: str | None
    store_timeout: float
    store_min_rate: int
    cluster_cache: str | None
    cluster_endpoint_url: str | None
    cluster_profile: str | None
    cluster_timeout: float
    etcd: tuple[str, ...] | None
    node_name: str | None
    cluster_lease_ttl: int
    cluster_staging_limit: int
    allow_other: bool
    uid: int | None
    gid: int | None
    file_mode: int
    dir_mode: int
    listing_attrs: bool
    metrics_addr: tuple[str, int] | None
    mount_name: str | None
    log_level: str
    log_file: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def effective_metadata_ttl(self) -> float:
        return math.inf if self.immutable or self.snapshot else self.metadata_ttl


def parse_option(name: str, value: Any, where: str) -> Any:
    """Parse one option's value; `where` says where it came from for the error message."""
    spec = OPTIONS_BY_NAME[name]
    try:
        return spec.parse(value)
    except (TypeError, ValueError) as error:
        raise AvafsError(f"invalid {where}: {error}") from None


def size_spelling_warning(name: str, value: Any, where: str) -> str | None:
    """For a size option's value with a one-letter decimal unit (`10G`), the warning that
    says how it is read (sizes.py); None otherwise."""
    if OPTIONS_BY_NAME[name].parse not in (_size, _positive_size):
        return None
    return decimal_letter_warning(value, where)


def build_mount_options(sources: dict[str, str], values: dict[str, Any]) -> MountOptions:
    """Apply defaults, then check what only the combination of values can tell."""
    settled = {spec.name: values.get(spec.name, spec.default) for spec in MOUNT_OPTIONS}
    if settled["cache_dir"]:
        settled["cache_dir"] = Path(settled["cache_dir"]).expanduser().absolute()
    else:
        settled["cache_dir"] = default_cache_dir(sources, settled["endpoint_url"],
                                                 settled["block_size"])
    settled["log_file"] = Path(settled["log_file"]).expanduser().absolute() \
        if settled["log_file"] else log_path(settled["cache_dir"])
    if settled["low_watermark"] >= settled["high_watermark"]:
        raise AvafsError(
            f"invalid watermarks: --low-watermark ({settled['low_watermark']}) must be below "
            f"--high-watermark ({settled['high_watermark']})")
    if settled["disk_cache"] < settled["block_size"]:
        raise AvafsError(f"invalid --disk-cache: it must hold at least one block "
                         f"(--block-size {settled['block_size']} bytes)")
    if settled["inflight_memory"] < settled["block_size"]:
        raise AvafsError("invalid --inflight-memory: it must hold at least one block")
    if not settled["cluster_cache"] and (settled["cluster_endpoint_url"]
                                         or settled["cluster_profile"]):
        raise AvafsError("--cluster-endpoint-url and --cluster-profile need --cluster-cache "
                         "s3://BUCKET[/prefix]")
    if settled["writeback"] == "cluster" and not (settled["cluster_cache"] and settled["etcd"]):
        raise AvafsError("--writeback cluster needs --cluster-cache s3://BUCKET[/prefix] (where "
                         "files are staged) and --etcd URL[,URL...] (where their queue is kept)")
    if settled["snapshot"] and settled["writeback"] == "cluster":
        raise AvafsError("--snapshot mounts are read-only: drop --writeback cluster")
    if settled["snapshot"] and list(sources) != [""]:
        raise AvafsError("--snapshot serves one source: give SOURCE and MOUNTPOINT instead of "
                         "--config")
    if settled["snapshot"]:
        settled["read_only"] = True
    if settled["writeback"] == "cluster" and settled["read_only"]:
        raise AvafsError("--writeback cluster and --read-only contradict: drop one")
    if settled["writeback"] != "cluster" and (settled["etcd"] or settled["node_name"]
                                              or settled["cluster_staging_limit"]):
        raise AvafsError("--etcd, --node-name and --cluster-staging-limit are for --writeback "
                         "cluster: add it, or drop them")
    if settled["writeback"] == "cluster" and not settled["node_name"]:
        settled["node_name"] = _node_name(socket.gethostname() or "avafs")
    return MountOptions(sources=sources, **settled)
