"""Open an ObjectStore from a source URL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from ..errors import AvafsError
from .base import Listing, ObjectInfo, ObjectStore, StoreLimits

if TYPE_CHECKING:
    from .s3.cluster_bucket import ClusterBucket

__all__ = ["Listing", "ObjectInfo", "ObjectStore", "StoreLimits", "open_cluster_bucket",
           "open_store", "use_profile"]


def open_store(url: str, endpoint_url: str | None = None, region: str | None = None,
               max_connections: int = 64, limits: StoreLimits | None = None) -> ObjectStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise AvafsError(f"invalid source {url!r}: a local bucket is file:///absolute/dir")
        from .local import LocalStore

        return LocalStore(Path(unquote(parsed.path)))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise AvafsError(f"invalid source {url!r}: expected s3://bucket[/prefix]")
        try:
            from .s3.store import S3Store
        except ImportError:
            raise AvafsError("s3:// sources need boto3: pip install 'avafs[s3]'") from None
        return S3Store(parsed.netloc, unquote(parsed.path), endpoint_url, region, max_connections,
                       limits or StoreLimits())
    raise AvafsError(f"unknown scheme in source {url!r}: use s3://bucket[/prefix] or "
                     "file:///absolute/dir")


def use_profile(profile: str | None) -> None:
    """`--profile`: the sources' credentials from this AWS profile, here and in the daemon this
    process starts (stores/s3/profile.py)."""
    if profile is None:
        return
    try:
        from .s3.profile import use_source_profile
    except ImportError:
        raise AvafsError("--profile needs boto3: pip install 'avafs[s3]'") from None
    use_source_profile(profile)


def open_cluster_bucket(url: str, endpoint_url: str | None, profile: str | None,
                        timeout: float) -> ClusterBucket:
    """The bucket of `--cluster-cache s3://BUCKET[/prefix]` (stores/s3/cluster_bucket.py)."""
    try:
        from .s3.cluster_bucket import open_cluster_bucket as open_bucket
    except ImportError:
        raise AvafsError("--cluster-cache needs boto3: pip install 'avafs[s3]'") from None
    return open_bucket(url, endpoint_url, profile, timeout)
