"""AWS Signature Version 4 for the lean requests, signing exactly what they send.

Why not botocore's signer: it builds every request's canonical form through its general
machinery (a case-insensitive header map built twice, the payload policy read from request
context, the signing key derived anew with four HMACs), which costs several times what the
signing itself does, per request, on the daemon's one interpreter lock. The lean requests
come in three shapes (a ranged or whole GET, a single PUT, a LIST page) whose URLs are already
in canonical form: the path quoted with `/` and `~` left as they are, the query quoted per RFC
3986 by `canonical_query`. So the canonical request is a few joins, and the signing key is kept
for the day it is valid.

What the signature covers is what botocore's `S3SigV4Auth` covers when boto3 sends the same
request (tests compare the two header for header): the method, path and sorted query, every
header the caller gives plus `host`, `x-amz-date`, `x-amz-content-sha256` and, with temporary
credentials, `x-amz-security-token`.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
DEFAULT_PORTS = {"http": 80, "https": 443}


def canonical_query(query: dict[str, str]) -> str:
    """A query string whose encoding is SigV4's (RFC 3986: a space is %20, never `+`), so
    the string sent is the string signed."""
    return urlencode(query, quote_via=quote, safe="-_.~")


class Signer:
    """Signs requests with one set of credentials for one region of S3. Thread-safe: the
    cached signing key is replaced whole, never updated in place."""

    def __init__(self, credentials: Any, region: str) -> None:
        """`credentials` is botocore's: refreshable ones are read afresh for every request."""
        self._credentials = credentials
        self._region = region
        self._key: tuple[str, str, bytes] = ("", "", b"")

    def headers(self, method: str, url: str, headers: dict[str, str], body: bytes | None,
                now: datetime | None = None) -> dict[str, str]:
        """`headers` with the date, payload hash, token and Authorization added: what to send.
        `now` (UTC) is for tests; a request is signed for the current time otherwise."""
        frozen = self._credentials.get_frozen_credentials()
        stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        parts = urlsplit(url)
        signed = dict(headers)
        signed["X-Amz-Date"] = stamp
        signed["X-Amz-Content-SHA256"] = _payload_hash(parts.scheme, headers, body)
        if frozen.token:
            signed["X-Amz-Security-Token"] = frozen.token
        canonical = {name.lower(): " ".join(value.split()) for name, value in signed.items()}
        canonical["host"] = host_header(parts)
        names = sorted(canonical)
        signed_names = ";".join(names)
        request = "\n".join((
            method, parts.path or "/", _sorted_query(parts.query),
            "".join(f"{name}:{canonical[name]}\n" for name in names), signed_names,
            signed["X-Amz-Content-SHA256"]))
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join((ALGORITHM, stamp, scope,
                             hashlib.sha256(request.encode()).hexdigest()))
        signature = hmac.new(self._signing_key(frozen.secret_key, day), to_sign.encode(),
                             hashlib.sha256).hexdigest()
        signed["Authorization"] = (f"{ALGORITHM} Credential={frozen.access_key}/{scope}, "
                                   f"SignedHeaders={signed_names}, Signature={signature}")
        return signed

    def would_refresh(self) -> bool:
        """Whether signing now would first renew the credentials, a call to their provider
        (an instance role, STS) that blocks: a caller that must not block signs later or
        elsewhere. Static credentials never renew."""
        refresh_needed = getattr(self._credentials, "refresh_needed", None)
        return refresh_needed is not None and refresh_needed()

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached_secret, cached_day, key = self._key
        if cached_secret != secret or cached_day != day:
            key = f"AWS4{secret}".encode()
            for part in (day, self._region, "s3", "aws4_request"):
                key = hmac.digest(key, part.encode(), "sha256")
            self._key = (secret, day, key)
        return key


def _payload_hash(scheme: str, headers: dict[str, str], body: bytes | None) -> str:
    """The body's SHA-256, except where TLS protects the body on the way and a checksum
    header lets the store refuse a damaged one: there, as for boto3's own uploads, the
    payload is not hashed (a SHA-256 costs several times the CRC the checksum header took)."""
    if not body:
        return EMPTY_SHA256
    if scheme == "https" and any(name.lower() == "content-md5"
                                 or name.lower().startswith("x-amz-checksum-")
                                 for name in headers):
        return UNSIGNED_PAYLOAD
    return hashlib.sha256(body).hexdigest()


def _sorted_query(query: str) -> str:
    """The query's parameters sorted by name, then value (not as `name=value` strings,
    which would put `a-b=` before `a=`)."""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&")) if query else []
    return "&".join(f"{name}={value}" for name, value in pairs)


def host_header(parts) -> str:
    """The Host header urllib3 sends for this URL: the port only when it is not the
    scheme's default; an IPv6 address in brackets."""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host
