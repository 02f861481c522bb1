"""`s3://bucket[/prefix]`: any S3-compatible endpoint, through boto3 in worker threads.

Why boto3 in threads rather than aiobotocore: the store is called from threads that are not
the FUSE loop (read-ahead streams, warmups, uploads, the control socket) as much as from it,
and aiobotocore was not faster where it was measured (BENCHMARKS.md); boto3's client is
thread-safe, pools connections, and its "standard" retry mode already retries 5xx,
throttling and connection errors with exponential backoff.

Errors that reach users never carry credentials: messages are composed here from the bucket,
the endpoint and the error code only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import replace
from typing import BinaryIO
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
import urllib3.exceptions
from botocore.config import Config

from ...errors import AvafsError, ObjectChangedError, StoreError
from .. import metadata
from ..base import Listing, ObjectInfo, ObjectStore, StoreLimits
from ..metadata import Attrs
from . import botocore_adapter
from .deadlines import DeadlineBody, DeadlinePassed, Deadlines
from .lean import Changed, LeanRequests
from .loop_get import LoopGets, TransferFailed, Unreachable
from .multipart import PART, TRANSFER, S3MultipartUploads
from .replies import error_code, unquoted_etag
from .versions import GONE, current_versions, read_version

log = logging.getLogger(__name__)

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
           "InvalidToken", "AllAccessDisabled"}
_MISSING_BUCKET = {"NoSuchBucket", "404", "NotFound"}
_TRANSIENT = {"RequestTimeout", "RequestTimeTooSkewed", "ExpiredToken", "SlowDown", "Throttling",
              "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "408", "429"}
"""4xx answers that may pass: everything else in 4xx is the store refusing for good."""
_PERMANENT_CLIENT_ERRORS = (botocore.exceptions.NoCredentialsError,
                            botocore.exceptions.PartialCredentialsError,
                            botocore.exceptions.ParamValidationError)
_ATTEMPTS = 4
"""Attempts per request, the first included (botocore's `total_max_attempts`; its
`max_attempts` counts retries only): each is bounded by StoreLimits, and the callers retry on
their own terms (the uploader forever, a lookup at its next call)."""
_MAX_KEY_BYTES = 1024
"""S3's limit on a key, in UTF-8 bytes."""
_READ_TRIES = 6
"""Tries of one data read: a body that broke off is asked for again, within _READ_BUDGET."""
_READ_BUDGET = 2
"""A data read's tries together take at most this many times the limit of one (StoreLimits),
so a store that does not answer costs a reader two timeouts before EIO, not six."""
_FAILED_READ_MEMORY = 1.0
"""Seconds a failed read is answered with its error without asking the store again: the
kernel follows a failed read-ahead at once with a read of its own of the same pages, which
would make a reader wait for a dead store twice."""
_DEFAULT_LIMITS = StoreLimits()


def _printable_endpoint(url: str | None) -> str:
    """The endpoint for messages, without any user:password part a URL might carry."""
    if not url:
        return "the default AWS endpoint"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _status(error: botocore.exceptions.ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _is_permanent(error: Exception) -> bool:
    """Whether repeating the request cannot help: a 4xx that is no throttle or clock skew,
    or a client without usable credentials."""
    if isinstance(error, botocore.exceptions.ClientError):
        return 400 <= _status(error) < 500 and error_code(error) not in _TRANSIENT
    return isinstance(error, _PERMANENT_CLIENT_ERRORS)


def _size_class(size: int) -> int:
    """Requests are timed by class, so a handful of clients serve every size: 0 for requests
    without data, else the size rounded up to a power of two, at least 1 MiB."""
    return 0 if size <= 0 else 1 << max(20, (size - 1).bit_length())


class S3Store(S3MultipartUploads, ObjectStore):
    """A bucket (or a prefix of one) over S3's API. Larger than the rest on purpose: every
    request here shares one set of clients per size class, one way of turning botocore's
    failures into StoreErrors that say permanent or not, and one budget of tries per read;
    the transports that send requests another way live beside it (lean.py, loop_get.py),
    multipart uploads in a part of their own (multipart.py), and what only the cluster tier
    needs in its subclass (cluster_bucket.py)."""

    timeout_option = "--store-timeout"
    min_rate_option = "--store-min-rate"
    """What sets this store's request limits, as messages about a late answer name them."""
    endpoint_option = "--endpoint-url"
    location_options = "--endpoint-url/--region"
    """What says where this store is, as messages about an unreachable one name them."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None,
                 region: str | None, max_connections: int = 64,
                 limits: StoreLimits = _DEFAULT_LIMITS,
                 session: boto3.session.Session | None = None,
                 attempts: int = _ATTEMPTS) -> None:
        """`session` carries the credentials (default: the AWS environment and config);
        `attempts` bounds botocore's tries per request."""
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self.endpoint = _printable_endpoint(endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                                            or os.environ.get("AWS_ENDPOINT_URL"))
        self._session = session or boto3.session.Session()
        self._attempts = attempts
        self._common = {"endpoint_url": endpoint_url, "region_name": region}
        self._limits = limits
        self._max_connections = max_connections
        self._clients: dict[tuple[int, int], object] = {}
        self._deadlines = Deadlines()
        self._failed_reads: dict[tuple[str, int, int, str], tuple[float, StoreError]] = {}
        """Reads that just failed, until when they fail again without asking (_clients_lock)."""
        self._clients_lock = threading.Lock()
        self._client = self._sized(0)
        self._probe_client = self._session.client("s3", config=Config(
            retries={"mode": "standard", "total_max_attempts": 3},
            connect_timeout=limits.timeout, read_timeout=limits.timeout), **self._common)
        self._lean = LeanRequests(self._sized, self._session.get_credentials(), bucket)
        self._loop_gets = LoopGets(self._client, max_connections)

    def _sized(self, size: int, attempts: int = 0):
        """The client whose timeouts suit a request carrying `size` bytes (StoreLimits): the
        connect timeout is the limit's seconds, the read timeout (which also bounds sending a
        body held in memory) adds the transfer time at the minimum rate. `attempts` overrides
        the store's tries per request (a data read counts its own)."""
        slot = (_size_class(size), attempts or self._attempts)
        client = self._clients.get(slot)
        if client is None:
            with self._clients_lock:
                client = self._clients.get(slot)
                if client is None:
                    client = self._clients[slot] = self._session.client("s3", config=Config(
                        retries={"mode": "standard", "total_max_attempts": slot[1]},
                        connect_timeout=self._limits.timeout,
                        read_timeout=self._limits.for_size(slot[0]),
                        max_pool_connections=self._max_connections, tcp_keepalive=True),
                        **self._common)
        return client

    def _failure(self, error: Exception, action: str) -> StoreError:
        return StoreError(self._describe(error, action), permanent=_is_permanent(error))

    def _describe(self, error: Exception, action: str = "") -> str:
        """A message for users: the endpoint, the bucket, what was asked and the store's
        answer (status, code and message), never a credential."""
        if isinstance(error, botocore.exceptions.NoCredentialsError):
            return (f"no AWS credentials found for {self.url}: set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role")
        if isinstance(error, (botocore.exceptions.EndpointConnectionError,
                              botocore.exceptions.ConnectTimeoutError,
                              botocore.exceptions.ConnectionClosedError,
                              Unreachable)):
            # A server that resets a connection it accepted gives either a failed connection
            # or one closed before any answer, by a race with the request's send: one cause,
            # so one message.
            return (f"cannot reach S3 endpoint {self.endpoint}: check {self.endpoint_option} "
                    "and that the server is up")
        if isinstance(error, botocore.exceptions.ClientError):
            code = error_code(error)
            if code in _DENIED:
                return (f"access denied to bucket {self.bucket!r} at {self.endpoint} ({code}): "
                        "check the credentials and the bucket policy")
            if code == "NoSuchBucket" or (not action and code in _MISSING_BUCKET):
                return (f"bucket {self.bucket!r} not found at {self.endpoint}: check the name "
                        f"and {self.location_options}")
            if code in ("301", "PermanentRedirect", "AuthorizationHeaderMalformed"):
                return f"bucket {self.bucket!r} is in another region: pass --region"
            answer = error.response.get("Error", {}).get("Message") or ""
            status = str(_status(error))
            return (f"S3 {action or 'request'} in bucket {self.bucket!r} at {self.endpoint} "
                    f"failed: {status}" + (f" {code}" if code != status else "")
                    + (f" ({answer})" if answer else ""))
        if isinstance(error, botocore.exceptions.ReadTimeoutError):
            return (f"S3 endpoint {self.endpoint} did not answer {action or 'a request'} in "
                    f"time: the store is overloaded or hung (see {self.timeout_option})")
        if isinstance(error, TransferFailed):
            return f"S3 {action or 'request'} at {self.endpoint} failed: {error}"
        return (f"S3 {action or 'request'} at {self.endpoint} failed: "
                f"{type(error).__name__}")

    def check(self) -> None:
        try:
            self._probe_client.head_bucket(Bucket=self.bucket)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
            raise AvafsError(self._describe(error)) from None

    def list_dir(self, prefix: str) -> Listing:
        prefixes: list[str] = []
        objects: list[ObjectInfo] = []
        skip = len(self.prefix)
        with self._store_errors(f"LIST of {prefix or '/'!r}"):
            listing = self._lean_list(prefix)
            if listing is not None:
                return listing
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix, Delimiter="/")
            for page in pages:
                prefixes.extend(entry["Prefix"][skip:] for entry in page.get("CommonPrefixes", ()))
                objects.extend(
                    ObjectInfo(entry["Key"][skip:], entry["Size"], unquoted_etag(entry["ETag"]),
                               entry["LastModified"].timestamp())
                    for entry in page.get("Contents", ()))
        return Listing(prefixes, objects)

    def _lean_list(self, prefix: str) -> Listing | None:
        """Every page through the lean path, or None to list again through boto3."""
        prefixes: list[str] = []
        objects: list[ObjectInfo] = []
        skip = len(self.prefix)
        token = None
        while True:
            page = self._lean.list_page(self.prefix + prefix, token)
            if page is None:
                return None
            prefixes.extend(found[skip:] for found in page.prefixes)
            objects.extend(replace(info, key=info.key[skip:]) for info in page.objects)
            token = page.next_token
            if token is None:
                return Listing(prefixes, objects)

    def head(self, key: str) -> ObjectInfo | None:
        return self._head(self._client, key)

    def head_quickly(self, key: str) -> ObjectInfo | None:
        """One try of --store-timeout: a failed one costs a reader no more than that."""
        return self._head(self._sized(0, attempts=1), key)

    def _head(self, client, key: str) -> ObjectInfo | None:
        try:
            reply = client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except botocore.exceptions.ClientError as error:
            if error_code(error) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._failure(error, f"HEAD of {key!r}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise self._failure(error, f"HEAD of {key!r}") from None
        mtime, attrs = metadata.decode(reply.get("Metadata", {}))
        return ObjectInfo(key, reply["ContentLength"], unquoted_etag(reply["ETag"]),
                          reply["LastModified"].timestamp() if mtime is None else mtime, attrs)

    def get_range(self, key: str, start: int, length: int, etag: str) -> bytes:
        """Tries (the lean GET, boto3 where the lean path cannot answer) until one gives the
        bytes, the store says the version is gone, _READ_TRIES failed, or the tries took
        _READ_BUDGET times the limit of one: a read of N bytes from a store that does not
        answer, or never finishes an answer, fails after at most _READ_BUDGET x
        (--store-timeout + max(N, 1 MiB)/--store-min-rate), while a body that broke off
        quickly is asked for again."""
        wanted = (key, start, length, etag)
        return self._tries(wanted, *self._read_bounds(wanted))

    async def get_range_async(self, key: str, start: int, length: int, etag: str,
                              threads: Executor) -> bytes:
        """`get_range` whose first try is sent from the running loop (loop_get.py) where it
        can be; the tries after a failed one, and every try of a GET the loop cannot send,
        run in one of `threads`, within the same bound as `get_range`'s."""
        wanted = (key, start, length, etag)
        limit, end = self._read_bounds(wanted)
        failed: StoreError | None = None
        try:
            data = await self._lean.get_on_loop(self._loop_gets, self.prefix + key, start,
                                                length, etag, limit)
        except Changed:
            raise self._changed(key) from None
        except TimeoutError:
            failed = StoreError(self._late(key, length, limit))
        except TransferFailed as error:
            failed = self._failure(error, f"GET of {key!r}")
        else:
            if data is not None:
                return data
        first = 0
        if failed is not None:
            await asyncio.sleep(self._next_try_in(wanted, failed, 0, limit, end))
            first = 1
        return await asyncio.wrap_future(threads.submit(self._tries, wanted, limit, end, first))

    async def get_described_async(self, listed: ObjectInfo, threads: Executor
                                  ) -> tuple[bytes, ObjectInfo]:
        """One try from the running loop (loop_get.py), bounded as a read's first try; where
        the loop cannot send it, a HEAD and a GET from a thread. The mtime is the object's metadata's, else the
        listing's write time (the headers' is whole seconds)."""
        key, size = listed.key, listed.size
        limit, _ = self._read_bounds((key, 0, size, listed.etag))
        try:
            answer = await self._lean.get_described_on_loop(self._loop_gets, self.prefix + key,
                                                            size, listed.etag, limit)
        except Changed:
            raise self._changed(key) from None
        except TimeoutError:
            raise StoreError(self._late(key, size, limit)) from None
        except TransferFailed as error:
            raise self._failure(error, f"GET of {key!r}") from None
        if answer is None:
            return await super().get_described_async(listed, threads)
        data, user_metadata = answer
        mtime, attrs = metadata.decode(user_metadata)
        return data, replace(listed, mtime=listed.mtime if mtime is None else mtime,
                             attrs=attrs)

    async def close_on_loop(self) -> None:
        await self._loop_gets.close()

    def _read_bounds(self, wanted: tuple[str, int, int, str]) -> tuple[float, float]:
        """(the limit of one try, the monotonic time all tries must end by) of a data read;
        raises its error instead while the same read failed moments ago
        (_FAILED_READ_MEMORY)."""
        failed = self._failed_reads.get(wanted)
        if failed is not None and time.monotonic() < failed[0]:
            raise failed[1]
        limit = self._limits.for_size(_size_class(wanted[2]))
        return limit, time.monotonic() + _READ_BUDGET * limit

    def _tries(self, wanted: tuple[str, int, int, str], limit: float, end: float,
               first: int = 0) -> bytes:
        """Tries `first` and on of one data read, which must end by `end` (monotonic)."""
        key, start, length, etag = wanted
        for attempt in range(first, _READ_TRIES):
            try:
                return self._get_once(key, start, length, etag,
                                      min(limit, end - time.monotonic()))
            except ObjectChangedError:
                raise
            except StoreError as error:
                time.sleep(self._next_try_in(wanted, error, attempt, limit, end))
        raise AssertionError("unreachable")

    def _next_try_in(self, wanted: tuple[str, int, int, str], error: StoreError, attempt: int,
                     limit: float, end: float) -> float:
        """Seconds to wait before the try after `attempt`, which failed with `error`; raises
        `error` instead, remembering it (_FAILED_READ_MEMORY), where the read may not be
        tried again: a permanent error, the last try, or too little of its time left."""
        left = end - time.monotonic()
        if error.permanent or attempt == _READ_TRIES - 1 or left < 0.2 * limit:
            self._remember_failure(wanted, error)
            raise error
        log.warning("retrying read of %s%r: %s", self.url, wanted[0], error)
        return min(0.1 * 2**attempt, left / 4)

    def _remember_failure(self, wanted: tuple[str, int, int, str], error: StoreError) -> None:
        now = time.monotonic()
        with self._clients_lock:
            for stale in [read for read, (until, _) in self._failed_reads.items() if until <= now]:
                del self._failed_reads[stale]
            self._failed_reads[wanted] = (now + _FAILED_READ_MEMORY, error)

    def _get_once(self, key: str, start: int, length: int, etag: str, seconds: float) -> bytes:
        with contextlib.closing(self._open(key, start, length, etag, seconds)) as body:
            try:
                data = body.read()
            except DeadlinePassed:
                raise StoreError(self._late(key, length, seconds)) from None
            except (urllib3.exceptions.HTTPError, OSError,
                    botocore.exceptions.BotoCoreError) as error:
                raise self._failure(error, f"GET of {key!r}") from None
        if len(data) != length:
            raise StoreError(f"S3 GET of {key!r} at {self.endpoint} ended {length - len(data)} "
                             "bytes early")
        return data

    def _changed(self, key: str) -> ObjectChangedError:
        return ObjectChangedError(f"{self.url}{key} changed or vanished while being read")

    def _late(self, key: str, length: int, seconds: float) -> str:
        return (f"S3 endpoint {self.endpoint} did not send the {length} bytes of {key!r} in "
                f"time ({seconds:.1f}s: {self.timeout_option} plus the size at "
                f"{self.min_rate_option}): the store is overloaded or hung")

    def walk_versions(self, prefix: str) -> Iterator[tuple[ObjectInfo, str | None]]:
        """One listing of the whole prefix, with version ids where the bucket keeps them
        (versions.py)."""
        with self._store_errors(f"listing of {prefix or '/'!r} with versions"):
            yield from current_versions(self._client, self.bucket, self.prefix + prefix,
                                        len(self.prefix))

    def get_version_range(self, key: str, start: int, length: int, version_id: str) -> bytes:
        try:
            data = read_version(self._sized(length), self.bucket, self.prefix + key, start,
                                length, version_id)
        except botocore.exceptions.ClientError as error:
            if error_code(error) in GONE:
                raise ObjectChangedError(f"{self.url}{key}: version {version_id} is gone") \
                    from None
            raise self._failure(error, f"GET of version {version_id} of {key!r}") from None
        except (botocore.exceptions.BotoCoreError, urllib3.exceptions.HTTPError,
                OSError) as error:
            raise self._failure(error, f"GET of version {version_id} of {key!r}") from None
        if len(data) != length:
            raise StoreError(f"S3 GET of {key!r} at {self.endpoint} ended {length - len(data)} "
                             "bytes early")
        return data

    def open_range(self, key: str, start: int, length: int, etag: str) -> BinaryIO:
        """One GET whose body is read as it arrives, within --store-timeout plus the length at
        --store-min-rate (a stream that broke off or ran late is the caller's to recover: it
        refetches the blocks it did not get with get_range, which retries)."""
        return self._open(key, start, length, etag, self._limits.for_size(length))

    def _open(self, key: str, start: int, length: int, etag: str,
              seconds: float) -> DeadlineBody:
        """One GET, the lean one where it answers; its body read within `seconds` of now."""
        try:
            raw = self._lean.open(self.prefix + key, start, length, etag)
        except Changed:
            raise self._changed(key) from None
        except botocore.exceptions.BotoCoreError as error:
            raise self._failure(error, f"GET of {key!r}") from None
        if raw is None:
            try:
                reply = self._sized(length, attempts=1).get_object(
                    Bucket=self.bucket, Key=self.prefix + key, IfMatch=f'"{etag}"',
                    Range=f"bytes={start}-{start + length - 1}")
            except botocore.exceptions.ClientError as error:
                if error_code(error) in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                    raise self._changed(key) from None
                raise self._failure(error, f"GET of {key!r}") from None
            except botocore.exceptions.BotoCoreError as error:
                raise self._failure(error, f"GET of {key!r}") from None
            raw = botocore_adapter.raw_stream(reply["Body"])
        return DeadlineBody(raw, self._deadlines, seconds)

    def put(self, key: str, body: BinaryIO, size: int, mtime: float | None = None,
            attrs: Attrs | None = None) -> ObjectInfo:
        """One PutObject below 64 MiB (its reply carries the ETag: one request per file, as
        checkpoints and logs are mostly small; the lean path first), managed multipart above;
        both are atomic for readers in S3."""
        attrs = attrs or Attrs()
        user = {} if mtime is None else metadata.encode(mtime, attrs)
        with self._store_errors(f"PUT of {key!r}"):
            if size < TRANSFER.multipart_threshold:
                data = body.read()
                etag = self._lean.put(self.prefix + key, data, user)
                if etag is None:
                    etag = unquoted_etag(self._sized(size).put_object(Bucket=self.bucket,
                                                              Key=self.prefix + key,
                                                              Body=data, Metadata=user)["ETag"])
                if mtime is None:
                    return ObjectInfo(key, size, etag, time.time())
                return ObjectInfo(key, size, etag, mtime, attrs)
            self._sized(PART).upload_fileobj(body, self.bucket, self.prefix + key,
                                              Config=TRANSFER, ExtraArgs={"Metadata": user})
        info = self.head(key)
        if info is None:
            raise StoreError(f"{self.url}{key} is missing right after its upload")
        return info

    @contextlib.contextmanager
    def _store_errors(self, action: str) -> Iterator[None]:
        """boto3's errors as StoreError with a message fit for users."""
        try:
            yield
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
            raise self._failure(error, action) from None

    def delete(self, key: str) -> None:
        """A 404 other than for the bucket (some stores answer so for keys they cannot hold)
        leaves the key absent, which is what was asked."""
        with self._store_errors(f"DELETE of {key!r}"):
            try:
                self._client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
            except botocore.exceptions.ClientError as error:
                if _status(error) != 404 or error_code(error) == "NoSuchBucket":
                    raise

    # --- part-by-part uploads --------------------------------------------------------------

    def key_fits(self, key: str) -> bool:
        return len((self.prefix + key).encode()) <= _MAX_KEY_BYTES

    def copy(self, source_key: str, key: str, etag: str, mtime: float | None = None,
             attrs: Attrs | None = None) -> ObjectInfo:
        """Managed copy (multipart above 64 MiB), only of the version that was renamed.

        New attributes replace the metadata (MetadataDirective REPLACE, which S3 needs to copy
        an object onto itself) merged over the source's, so what other tools keep there (a
        checksum, a content type) stays."""
        extra: dict[str, object] = {"CopySourceIfMatch": f'"{etag}"'}
        try:
            if mtime is not None:
                source = self._client.head_object(Bucket=self.bucket, Key=self.prefix + source_key,
                                                  IfMatch=f'"{etag}"')
                extra.update(MetadataDirective="REPLACE", Metadata={
                    **source.get("Metadata", {}), **metadata.encode(mtime, attrs or Attrs())})
                if "ContentType" in source:
                    extra["ContentType"] = source["ContentType"]
            self._sized(TRANSFER.multipart_threshold).copy(
                {"Bucket": self.bucket, "Key": self.prefix + source_key},
                self.bucket, self.prefix + key, ExtraArgs=extra, Config=TRANSFER)
        except botocore.exceptions.ClientError as error:
            if error_code(error) in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                raise ObjectChangedError(f"{self.url}{source_key} changed before its copy") \
                    from None
            raise self._failure(error, f"copy of {source_key!r} to {key!r}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise self._failure(error, f"copy of {source_key!r} to {key!r}") from None
        info = self.head(key)
        if info is None:
            raise StoreError(f"{self.url}{key} is missing right after its copy")
        return info
