"""A StorageClass's bucket as the controller uses it: small records and whole prefixes.

The controller reads, writes and deletes a few objects, and deletes everything under a
volume's prefix, with the credentials of each request's secrets. avafs's ObjectStore takes its
credentials from the process's environment, which one process serving many StorageClasses
cannot switch per request, so S3 is reached through a boto3 client of the request's own.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .state import write_atomically
from .volume_spec import Credentials

DELETE_BATCH = 1000
"""The most keys one S3 DeleteObjects request may name."""


class BucketError(Exception):
    """The bucket could not be read or changed; the message says what the store answered."""


class Bucket(ABC):
    """Keys are relative to the StorageClass's bucket URL (a bucket, or a prefix of one)."""

    @abstractmethod
    def read(self, key: str) -> bytes | None:
        """The object's body, or None if there is no such object."""

    @abstractmethod
    def write(self, key: str, body: bytes) -> None:
        """Store `body` as `key`; a key ending in '/' is a directory marker."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key`; a missing key is not an error."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under `prefix` (ending in '/'); how many were removed."""


class LocalBucket(Bucket):
    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, key: str) -> Path:
        return self._root / key

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise BucketError(f"cannot read {self._path(key)}: {error.strerror}") from None

    def write(self, key: str, body: bytes) -> None:
        try:
            if key.endswith("/"):
                self._path(key).mkdir(parents=True, exist_ok=True)
            else:
                write_atomically(self._path(key), body)
        except OSError as error:
            raise BucketError(f"cannot write {self._path(key)}: {error.strerror}") from None

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as error:
            raise BucketError(f"cannot delete {self._path(key)}: {error.strerror}") from None

    def delete_prefix(self, prefix: str) -> int:
        directory = self._path(prefix)
        if not directory.is_dir():
            return 0
        count = sum(1 for path in directory.rglob("*") if not path.is_dir())
        try:
            shutil.rmtree(directory)
        except OSError as error:
            raise BucketError(f"cannot delete {directory}: {error.strerror}") from None
        return count


class S3Bucket(Bucket):
    def __init__(self, name: str, prefix: str, endpoint_url: str | None, region: str | None,
                 credentials: Credentials | None) -> None:
        import boto3
        from botocore.config import Config

        keys = {}
        if credentials is not None:
            keys = {"aws_access_key_id": credentials.access_key_id,
                    "aws_secret_access_key": credentials.secret_access_key,
                    "aws_session_token": credentials.session_token}
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, **keys,
            config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}))
        self._name = name
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def _failure(self, action: str, key: str, error: Exception) -> BucketError:
        from botocore.exceptions import ClientError

        where = f"{action} s3://{self._name}/{self._prefix}{key}"
        if isinstance(error, ClientError):
            details = error.response.get("Error", {})
            return BucketError(f"{where}: {details.get('Code')}: {details.get('Message')}")
        return BucketError(f"{where}: {error}")

    def _call(self, action: str, key: str, method: str, **arguments) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, method)(Bucket=self._name, **arguments)
        except (BotoCoreError, ClientError) as error:
            raise self._failure(action, key, error) from None

    def read(self, key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._client.get_object(Bucket=self._name,
                                           Key=self._prefix + key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._failure("read", key, error) from None
        except BotoCoreError as error:
            raise self._failure("read", key, error) from None

    def write(self, key: str, body: bytes) -> None:
        self._call("write", key, "put_object", Key=self._prefix + key, Body=body)

    def delete(self, key: str) -> None:
        self._call("delete", key, "delete_object", Key=self._prefix + key)

    def delete_prefix(self, prefix: str) -> int:
        count = 0
        while True:
            listing = self._call("list", prefix, "list_objects_v2", Prefix=self._prefix + prefix,
                                 MaxKeys=DELETE_BATCH)
            keys = [{"Key": item["Key"]} for item in listing.get("Contents", [])]
            if not keys:
                return count
            response = self._call("delete", prefix, "delete_objects",
                                  Delete={"Objects": keys, "Quiet": True})
            if response.get("Errors"):
                first = response["Errors"][0]
                raise BucketError(f"delete s3://{self._name}/{first['Key']}: {first['Code']}: "
                                  f"{first['Message']}")
            count += len(keys)


def open_bucket(url: str, endpoint_url: str | None, region: str | None,
                credentials: Credentials | None) -> Bucket:
    """The bucket of a checked `s3://bucket[/prefix]` or `file:///dir` URL."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return LocalBucket(Path(unquote(parts.path)))
    return S3Bucket(parts.netloc, unquote(parts.path), endpoint_url, region, credentials)
