"""Ranged GETs, single PUTs and LIST pages without botocore's per-request machinery.

Why: botocore runs its whole per-request machinery on every get_object or put_object (endpoint
rules, event hooks, parameter validation, header parsing), and parses a 1000-key LIST page into
dicts with dateutil; that CPU is taken from the readers, the writers and, on a shared machine,
the server (see BENCHMARKS.md, "S3 transports"). The same request, signed by sigv4.py
and sent over the client's own HTTP session (its connection pool, proxies, CA
bundle and timeouts), costs a fraction of that; `botocore_adapter.py` holds every botocore
internal that takes. Only the answer we expect is handled here: anything else (an error status,
a redirect, a dropped connection) returns None, and the caller repeats the request through the
full client, which owns retries, redirects and error reporting; a request that got no answer in
time raises botocore's error, as the full client would only wait again. An answer that says the lean
path itself is wrong (a redirect or a 400, as for a bucket in another region than the
client's) turns the lean path off for the mount.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit
from xml.etree import ElementTree

import botocore.exceptions
import urllib3.exceptions

from ..base import ObjectInfo
from . import botocore_adapter, sigv4
from .loop_get import LoopGets

log = logging.getLogger(__name__)

OK = 200
PARTIAL_CONTENT = 206
CHANGED = (404, 412)
"""A vanished key or a failed If-Match: the version being read is gone."""
WRONG_PATH = (301, 307, 400)
"""Answers that would repeat on every lean request (the bucket lives elsewhere, the request
is malformed for this server): boto3, which follows redirects, takes over for good."""
_S3 = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_METADATA = "x-amz-meta-"


@dataclass(frozen=True)
class ListPage:
    """One ListObjectsV2 page of a directory: full keys and prefixes, and the next token."""

    prefixes: list[str]
    objects: list[ObjectInfo]
    next_token: str | None


class Changed(Exception):
    """The store answered that the object's version is gone (404 or 412)."""


class LeanRequests:
    def __init__(self, clients: Callable[[int], Any], credentials, bucket: str) -> None:
        """`clients(size)` is the boto3 client whose HTTP session (and so whose timeouts)
        suits a request carrying `size` bytes; `clients(0)` signs and addresses."""
        self._clients = clients
        self._client = clients(0)
        self._signer = sigv4.Signer(credentials, self._client.meta.region_name or "us-east-1")
        self._bucket = bucket
        self._base: str | None = None
        self._usable = credentials is not None and _shape_expected(self._client)

    def _bucket_url(self) -> str | None:
        """The bucket's URL as the client addresses it (virtual-hosted or path style,
        endpoint rules applied), resolved once from a presigned URL of a probe key."""
        if self._base is None and self._usable:
            try:
                url = self._client.generate_presigned_url(
                    "get_object", Params={"Bucket": self._bucket, "Key": "k"}, ExpiresIn=60)
            except botocore.exceptions.BotoCoreError as error:
                log.info("lean requests disabled (%s); every request goes through boto3",
                         type(error).__name__)
                self._usable = False
                return None
            parts = urlsplit(url)
            if not parts.path.endswith("/k"):
                self._usable = False
                return None
            self._base = f"{parts.scheme}://{parts.netloc}{parts.path[:-1]}"
        return self._base

    def open(self, key: str, start: int, length: int, etag: str) -> Any | None:
        """The urllib3 response holding bytes [start, start+length) of this version, its body
        not read yet; None when the full client should handle the request. Raises Changed for
        a gone version, and botocore's error for a failed transport (a store that cannot be
        reached or does not answer in time: asking boto3 the same would only wait again)."""
        base = self._bucket_url()
        if base is None:
            return None
        response = self._send("GET", base + quote(key, safe="/~"),
                              _range_headers(start, length, etag), size=length,
                              stream_output=True, transport_errors=True)
        raw = response.raw
        if _whole_range(response.status_code, response.headers, length):
            return raw
        raw.close()
        if response.status_code in CHANGED:
            raise Changed()
        return None

    async def get_on_loop(self, gets: LoopGets, key: str, start: int, length: int, etag: str,
                          seconds: float) -> bytes | None:
        """The `open` request sent from the running loop through `gets` and read whole
        within `seconds`: bytes [start, start+length) of this version, or None when the full
        path should handle the request (this loop cannot send it, signing would first
        renew the credentials, or the answer is not the expected one). Raises Changed for
        a gone version, TimeoutError and loop_get.TransferFailed for a failed transfer."""
        answer = await self._range_on_loop(gets, key, start, length, etag, seconds)
        return None if answer is None else answer[0]

    async def get_described_on_loop(self, gets: LoopGets, key: str, length: int, etag: str,
                                    seconds: float) -> tuple[bytes, dict[str, str]] | None:
        """`get_on_loop` of a whole object of `length` bytes, with its user metadata (named
        as `get_object` names it): what a HEAD would have told, in the answer that brings
        the bytes."""
        answer = await self._range_on_loop(gets, key, 0, length, etag, seconds)
        return None if answer is None else (answer[0], _user_metadata(answer[1]))

    async def _range_on_loop(self, gets: LoopGets, key: str, start: int, length: int, etag: str,
                             seconds: float) -> tuple[bytes, Any] | None:
        """(body, headers) of `get_on_loop`'s request, or None as it answers None."""
        if self._base is None or self._signer.would_refresh():
            return None
        url = self._base + quote(key, safe="/~")
        answer = await gets.get(url, self._signer.headers("GET", url, _range_headers(
            start, length, etag), None), seconds)
        if answer is None:
            return None
        status, headers, body = answer
        self._note_status(status)
        if status in CHANGED:
            raise Changed()
        if _whole_range(status, headers, length) and len(body) == length:
            return body, headers
        return None

    def get_object(self, key: str, size: int) -> tuple[bytes, dict[str, str]] | None:
        """The whole object `key` (of about `size` bytes) and its user metadata, named as
        boto3 names it (lower case, without `x-amz-meta-`); None when the full client should
        handle the request. Raises Changed when the key is absent. No checksum of the body is
        checked: for a caller that checks the bytes itself."""
        base = self._bucket_url()
        if base is None:
            return None
        url = base + quote(key, safe="/~")
        response = self._send("GET", url, {}, size=size, stream_output=True)
        if response is None:
            return None
        body = _read_body(response.raw, url)
        if body is None or response.status_code not in (OK, 404):
            return None
        if response.status_code == 404:
            raise Changed()
        return body, _user_metadata(response.headers)

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str | None:
        """Store an object with user `metadata` in one PutObject; its ETag, or None when the
        full client should do it. The body's checksum lets the server refuse a body damaged on the way (over
        HTTPS the SigV4 signature does not cover the payload)."""
        base = self._bucket_url()
        if base is None:
            return None
        response = self._send(
            "PUT", base + quote(key, safe="/~"),
            {"Content-Length": str(len(data)), **self._body_checksum(data),
             **{f"x-amz-meta-{name}": value for name, value in (metadata or {}).items()}},
            data=data, size=len(data))
        if response is None or response.status_code != OK or "etag" not in response.headers:
            return None
        return response.headers["etag"].strip('"')

    def _body_checksum(self, data: bytes) -> dict[str, str]:
        """The checksum botocore itself would send: CRC32 where the client sends checksums
        by default (much cheaper to compute than MD5), Content-MD5
        for stores configured without the newer checksum headers."""
        if sends_crc32(self._client):
            crc = zlib.crc32(data).to_bytes(4, "big")
            return {"x-amz-sdk-checksum-algorithm": "CRC32",
                    "x-amz-checksum-crc32": base64.b64encode(crc).decode()}
        digest = hashlib.md5(data, usedforsecurity=False).digest()
        return {"Content-MD5": base64.b64encode(digest).decode()}

    def list_page(self, prefix: str, token: str | None) -> ListPage | None:
        """One page of keys and common prefixes under `prefix` ('/' delimiter); None when
        the full client should list."""
        base = self._bucket_url()
        if base is None:
            return None
        if urlsplit(base).path != "/":
            base = base.rstrip("/")  # path-style: the bucket itself, as botocore sends it
        query = {"list-type": "2", "prefix": prefix, "delimiter": "/", "encoding-type": "url"}
        if token is not None:
            query["continuation-token"] = token
        response = self._send("GET", f"{base}?{sigv4.canonical_query(query)}", {})
        if response is None or response.status_code != OK:
            return None
        try:
            return _parse_list_page(response.content)
        except (ElementTree.ParseError, ValueError, TypeError, AttributeError):
            return None

    def _send(self, method: str, url: str, headers: dict[str, str], data: bytes | None = None,
              size: int = 0, stream_output: bool = False, transport_errors: bool = False):
        """Sign and send, bounded as a request of `size` bytes; None on a failed transport
        (the caller falls back), or botocore's error with `transport_errors`. A store that did
        not answer in time is botocore's error always: asking boto3 the same would only wait
        again, and a caller that allows one try would wait twice its limit."""
        try:
            response = botocore_adapter.send(self._clients(size), botocore_adapter.prepared(
                method, url, self._signer.headers(method, url, headers, data), data,
                stream_output))
        except (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError):
            raise
        except botocore.exceptions.BotoCoreError:
            if transport_errors:
                raise
            return None
        self._note_status(response.status_code)
        return response

    def _note_status(self, status: int) -> None:
        if status in WRONG_PATH:
            log.info("lean requests disabled: the store answered %d; every request goes "
                     "through boto3", status)
            self._usable = False
            self._base = None


def sends_crc32(client) -> bool:
    """Whether the client computes CRC32 checksums of uploads unasked, botocore's default
    (`request_checksum_calculation`, or AWS_REQUEST_CHECKSUM_CALCULATION, set to
    "when_required" turns it off for stores that refuse the headers)."""
    return client.meta.config.request_checksum_calculation == "when_supported"


def _read_body(raw, url: str) -> bytes | None:
    """The whole body of a response sent with `stream_output`, in one read: botocore's own
    `content` gathers a body from 64 KiB reads, and their per-read work was most of the CPU of
    a block's GET. None when the transfer broke off (the caller falls back to boto3);
    botocore's ReadTimeoutError when the store stopped sending in time, as botocore raises
    it for a body it reads itself."""
    try:
        return raw.read()
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as error:
        raise botocore.exceptions.ReadTimeoutError(endpoint_url=url, error=error) from None
    except (urllib3.exceptions.HTTPError, OSError):
        return None


def _user_metadata(headers) -> dict[str, str]:
    """The `x-amz-meta-*` headers of an answer, without the prefix, in lower case."""
    return {name.lower()[len(_METADATA):]: value for name, value in headers.items()
            if name.lower().startswith(_METADATA)}


def _range_headers(start: int, length: int, etag: str) -> dict[str, str]:
    return {"Range": f"bytes={start}-{start + length - 1}", "If-Match": f'"{etag}"'}


def _whole_range(status: int, headers, length: int) -> bool:
    return status == PARTIAL_CONTENT and int(headers.get("content-length", -1)) == length


def _shape_expected(client) -> bool:
    """Whether botocore still has the internals the lean path uses; if not, a WARNING at
    mount names them (a silent switch to the slow path would hide a botocore upgrade)."""
    moved = botocore_adapter.moved_internals(client)
    if moved:
        log.warning("botocore %s moved internals the lean S3 path uses (%s): every request "
                    "goes through boto3, more slowly; install a botocore avafs was tested "
                    "with or report it", botocore.__version__, ", ".join(moved))
    return not moved


def _parse_list_page(document: bytes) -> ListPage:
    root = ElementTree.fromstring(document)
    encoded = root.findtext(f"{_S3}EncodingType") == "url"

    def key(text: str) -> str:
        return unquote_plus(text) if encoded else text

    prefixes = [key(element.findtext(f"{_S3}Prefix"))
                for element in root.iterfind(f"{_S3}CommonPrefixes")]
    objects = [ObjectInfo(key(element.findtext(f"{_S3}Key")),
                          int(element.findtext(f"{_S3}Size")),
                          element.findtext(f"{_S3}ETag").strip('"'),
                          datetime.fromisoformat(element.findtext(f"{_S3}LastModified"))
                          .timestamp())
               for element in root.iterfind(f"{_S3}Contents")]
    truncated = root.findtext(f"{_S3}IsTruncated") == "true"
    return ListPage(prefixes, objects,
                    root.findtext(f"{_S3}NextContinuationToken") if truncated else None)

