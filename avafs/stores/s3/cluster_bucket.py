"""The cluster cache tier's bucket: an S3-compatible store run inside the cluster (SeaweedFS,
MinIO, Ceph RGW) that keeps blocks for every node.

It is an S3Store (the same sized clients, timeouts and messages) with credentials of its own,
so the origin's and the cache's may differ, plus the requests the tier needs beyond an
ObjectStore's: a whole block with its metadata, a PUT with metadata, a create that succeeds
only where the key is absent (If-None-Match: *, the store's own arbitration of which node
fills a block), and the age of a key by the store's clock (nodes' clocks may disagree).
"""

from __future__ import annotations

import os
from dataclasses import replace
from email.utils import parsedate_to_datetime
from typing import BinaryIO

import boto3
import botocore.exceptions
import botocore.session

from ...errors import AvafsError
from ..base import StoreLimits
from .lean import Changed
from .profile import profile_session
from .replies import error_code
from .store import S3Store, _size_class

ACCESS_KEY_VARIABLE = "AVAFS_CLUSTER_ACCESS_KEY_ID"
SECRET_KEY_VARIABLE = "AVAFS_CLUSTER_SECRET_ACCESS_KEY"
TOKEN_VARIABLE = "AVAFS_CLUSTER_SESSION_TOKEN"
_ABSENT = ("404", "NoSuchKey", "NotFound")
_TAKEN = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
"""A conditional create that lost: the key exists, or another create of it is under way."""
DELETE_BATCH = 1000
"""Most keys one DeleteObjects request may name (S3's limit)."""
CLUSTER_MIN_RATE = 16 * 2**20
"""Slowest transfer per second from the cluster store before a request is abandoned: a store
on the cluster's own network that falls below this is slower than going to the origin."""


def cluster_session(profile: str | None, checksums: bool = True) -> boto3.session.Session:
    """Credentials for the cache bucket: AVAFS_CLUSTER_ACCESS_KEY_ID and _SECRET_ACCESS_KEY
    (and _SESSION_TOKEN) from the environment, else the AWS profile `profile`, else the same
    chain the origin uses (AWS_* variables, ~/.aws, an instance role). Without `checksums`,
    botocore computes no CRC32 of what it sends and checks none of what it receives (only
    where S3 requires one): for a caller that checks the bytes itself."""
    core = botocore.session.Session()
    if not checksums:
        core.set_config_variable("request_checksum_calculation", "when_required")
        core.set_config_variable("response_checksum_validation", "when_required")
    key = os.environ.get(ACCESS_KEY_VARIABLE)
    secret = os.environ.get(SECRET_KEY_VARIABLE)
    if key or secret:
        if not (key and secret):
            raise AvafsError(f"{ACCESS_KEY_VARIABLE} and {SECRET_KEY_VARIABLE} go together: "
                             "set both, or neither to use --cluster-profile")
        if profile:
            raise AvafsError(f"both --cluster-profile and {ACCESS_KEY_VARIABLE} are set: "
                             "keep one")
        return boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret,
                                     aws_session_token=os.environ.get(TOKEN_VARIABLE),
                                     botocore_session=core)
    return profile_session(profile, "--cluster-profile", core)


class ClusterBucket(S3Store):
    timeout_option = "--cluster-timeout"
    min_rate_option = f"{CLUSTER_MIN_RATE >> 20} MiB/s"
    endpoint_option = location_options = "--cluster-endpoint-url"

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None,
                 profile: str | None, limits: StoreLimits, checksums: bool = True,
                 session: boto3.session.Session | None = None) -> None:
        """One try per request (attempts=1): the tier is a cache, and the origin is the
        retry of a cache request that failed. `checksums`: see `cluster_session`; a given
        `session` must have been made with the same."""
        super().__init__(bucket, prefix, endpoint_url, None, max_connections=32, limits=limits,
                         session=session or cluster_session(profile, checksums), attempts=1)
        self._endpoint_url = endpoint_url
        self._profile = profile
        self._checksums = checksums

    @property
    def timeout(self) -> float:
        """Seconds a request without data may take before it is abandoned."""
        return self._limits.timeout

    def for_blocks(self, timeout: float | None = None) -> ClusterBucket:
        """The same bucket with clients of its own for blocks whose bytes the caller checks
        (the cluster tier's checksum in each block's metadata), so botocore does not sum every
        block sent and received a second time; its requests may take `timeout`
        seconds (default: this bucket's) plus the transfer. Made from such a bucket, it
        shares its session (the S3 service model is parsed once per session)."""
        limits = self._limits if timeout is None else replace(self._limits, timeout=timeout)
        return ClusterBucket(self.bucket, self.prefix, self._endpoint_url, self._profile,
                             limits, checksums=False,
                             session=None if self._checksums else self._session)

    def with_timeout(self, timeout: float) -> ClusterBucket:
        """The same bucket, checksums as this one's, whose requests may take `timeout` seconds
        plus the transfer; it shares this bucket's session."""
        return ClusterBucket(self.bucket, self.prefix, self._endpoint_url, self._profile,
                             replace(self._limits, timeout=timeout), checksums=self._checksums,
                             session=self._session)

    def prepare_clients(self, largest: int) -> None:
        """Create now the client of every size class up to a `largest`-byte block: creating
        one parses the S3 service model, which a node's first block of each size would
        otherwise pay for inside its first epoch."""
        size = 1
        while size < largest:
            self._sized(size)
            size = _size_class(size) + 1
        self._sized(largest)

    def get_object(self, key: str, size: int) -> tuple[bytes, dict[str, str]] | None:
        """The whole object `key` (expected to be `size` bytes) and its metadata; None if it
        is absent. A bucket whose caller checks the bytes (`for_blocks`) sends it lean."""
        with self._store_errors(f"GET of {key!r}"):
            if not self._checksums:
                try:
                    found = self._lean.get_object(self.prefix + key, size)
                except Changed:
                    return None
                if found is not None:
                    return found
            try:
                reply = self._sized(size).get_object(Bucket=self.bucket, Key=self.prefix + key)
            except botocore.exceptions.ClientError as error:
                if error_code(error) in _ABSENT:
                    return None
                raise
            return reply["Body"].read(), reply.get("Metadata", {})

    def put_object(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        with self._store_errors(f"PUT of {key!r}"):
            self._sized(len(data)).put_object(Bucket=self.bucket, Key=self.prefix + key,
                                              Body=data, Metadata=metadata)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        """Create `key` holding `data` only if no object has that key; False if one has. A
        store that ignores If-None-Match creates it anyway (True for every caller)."""
        with self._store_errors(f"conditional PUT of {key!r}"):
            try:
                self._sized(0).put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data,
                                          IfNoneMatch="*")
            except botocore.exceptions.ClientError as error:
                if error_code(error) in _TAKEN:
                    return False
                raise
        return True

    def open_object(self, key: str, size: int) -> BinaryIO:
        """The object `key` of `size` bytes as a stream (a staged file, read once)."""
        with self._store_errors(f"GET of {key!r}"):
            return self._sized(size).get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"]

    def delete_all(self, keys: list[str]) -> int:
        """Delete `keys` (relative to the bucket's prefix), up to DELETE_BATCH per request;
        how many of them the store refused to delete (they are left in place)."""
        refused = 0
        with self._store_errors(f"DELETE of {len(keys)} objects"):
            for start in range(0, len(keys), DELETE_BATCH):
                answer = self._sized(0).delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": self.prefix + key}
                                for key in keys[start:start + DELETE_BATCH]],
                    "Quiet": True})
                refused += len(answer.get("Errors", ()))
        return refused

    def keys_under(self, prefix: str) -> list[str]:
        """Every key that starts with `prefix` (relative to the bucket's prefix)."""
        with self._store_errors(f"LIST of {prefix!r}"):
            pages = self._sized(0).get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix)
            return [item["Key"][len(self.prefix):] for page in pages
                    for item in page.get("Contents", ())]

    def open_uploads(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of every multipart upload started and not completed or aborted
        under `prefix` (relative to the bucket's prefix)."""
        with self._store_errors(f"LIST of the uploads under {prefix!r}"):
            pages = self._sized(0).get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix)
            return [(item["Key"][len(self.prefix):], item["UploadId"]) for page in pages
                    for item in page.get("Uploads", ())]

    def age(self, key: str) -> float | None:
        """Seconds since `key` was written, by the store's clock (its Date header against the
        object's Last-Modified); None if it is absent."""
        with self._store_errors(f"HEAD of {key!r}"):
            try:
                reply = self._sized(0).head_object(Bucket=self.bucket, Key=self.prefix + key)
            except botocore.exceptions.ClientError as error:
                if error_code(error) in _ABSENT:
                    return None
                raise
        date = reply.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if date is None:
            return 0.0
        return (parsedate_to_datetime(date) - reply["LastModified"]).total_seconds()


def open_cluster_bucket(url: str, endpoint_url: str | None, profile: str | None,
                        timeout: float) -> ClusterBucket:
    """The bucket of `--cluster-cache s3://BUCKET[/prefix]`. Its requests get `timeout`
    seconds plus a block's transfer at the in-cluster rate below."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return ClusterBucket(bucket, prefix, endpoint_url, profile,
                         StoreLimits(timeout=timeout, min_rate=CLUSTER_MIN_RATE))
