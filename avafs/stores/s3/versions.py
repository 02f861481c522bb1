"""What a snapshot needs of an S3 bucket: one listing of a whole prefix with each object's
current version id, and a ranged read of one version.

Why the versioning status is asked first: on a bucket that keeps versions, ListObjectVersions
gives each key's current version id in the same pages as its size and ETag, so a snapshot
can read that version after the key was overwritten or deleted; on one that keeps none, the
plain ListObjectsV2 (no delimiter, 1000 keys a page) is the cheaper listing. A version id of
"null" (written while versioning was suspended, or before it was enabled) is overwritten by
the next write of the key, so it is recorded as none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..base import ObjectInfo

GONE = frozenset({"NoSuchVersion", "NoSuchKey", "404", "InvalidArgument", "400"})
"""Answers to a GET of a version that mean the store no longer has it (an id it never had is
a 400 InvalidArgument on S3)."""


def keeps_versions(client: Any, bucket: str) -> bool:
    """Whether the bucket's versioning is on (or was, and is suspended: versions made before
    stay readable)."""
    return client.get_bucket_versioning(Bucket=bucket).get("Status") in ("Enabled",
                                                                         "Suspended")


def current_versions(client: Any, bucket: str, prefix: str,
                     skip: int) -> Iterator[tuple[ObjectInfo, str | None]]:
    """Every object under `prefix` (a key prefix in the bucket) with its current version id,
    keys without their first `skip` characters (the store's own prefix); directory markers
    and keys whose current version is a delete marker are left out."""
    if keeps_versions(client, bucket):
        pages = client.get_paginator("list_object_versions").paginate(Bucket=bucket,
                                                                      Prefix=prefix)
        entries = (entry for page in pages for entry in page.get("Versions", ())
                   if entry["IsLatest"])
    else:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        entries = (entry for page in pages for entry in page.get("Contents", ()))
    for entry in entries:
        if entry["Key"].endswith("/"):
            continue
        version = entry.get("VersionId")
        yield (ObjectInfo(entry["Key"][skip:], entry["Size"], entry["ETag"].strip('"'),
                          entry["LastModified"].timestamp()),
               None if version in (None, "null") else version)


def read_version(client: Any, bucket: str, key: str, start: int, length: int,
                 version_id: str) -> bytes:
    """`length` bytes from `start` of one version (botocore's errors pass through)."""
    reply = client.get_object(Bucket=bucket, Key=key, VersionId=version_id,
                              Range=f"bytes={start}-{start + length - 1}")
    with reply["Body"] as body:
        return body.read()
