"""The one place that reaches past boto3's documented API, for the lean request path.

What it reaches into, and why:
- `client._endpoint.http_session`, a `botocore.httpsession.URLLib3Session`, and its `send`:
  a request signed here goes out over the client's own connection pool, so it shares the
  client's keep-alive connections, proxies, CA bundle and timeouts instead of opening a pool
  of its own.
- that session's `_verify`, `_cert_file` and `_proxy_config` (with `proxy_url_for`): the loop
  client must verify TLS as the boto3 client does, and stand aside where the client uses a
  proxy or a client certificate.
- `botocore.auth.S3SigV4Auth`, `botocore.awsrequest.AWSRequest` and
  `botocore.httpsession.get_cert_path`, public names in modules boto3 does not document: the
  signer, the request it signs, and the CA bundle the session resolves.
- the `AWSResponse` that `send` returns: `status_code`, `headers`, `content`, and `raw`, the
  urllib3 response read as a stream.

None of this is a promised interface, so a botocore release may move any of it. When it
does, `moved_internals` names what moved, and the caller turns the lean path off for the
mount with a WARNING that says so (every request then goes through boto3, which is slower
but right); the mount is not refused, as boto3 alone serves every request. The tests in
tests/test_botocore_adapter.py check each of these against a real client, so a botocore
that changed shape fails there by name before any user sees the warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.httpsession import get_cert_path

_SESSION_ATTRIBUTES = ("_verify", "_cert_file", "_proxy_config")


@dataclass(frozen=True, slots=True)
class SessionTls:
    """How the client's HTTP session reaches the store."""

    ca_bundle: str | None
    """A CA file or directory; None for the system's."""
    verify: bool
    uses_proxy_or_client_cert: bool


def moved_internals(client: Any) -> list[str]:
    """The internals this module relies on that `client` lacks, named as reached; empty
    when botocore still has the expected shape."""
    endpoint = getattr(client, "_endpoint", None)
    if endpoint is None:
        return ["client._endpoint"]
    session = getattr(endpoint, "http_session", None)
    if session is None:
        return ["client._endpoint.http_session"]
    moved = [f"client._endpoint.http_session.{name}" for name in ("send", *_SESSION_ATTRIBUTES)
             if not hasattr(session, name)]
    proxies = getattr(session, "_proxy_config", None)
    if proxies is not None and not callable(getattr(proxies, "proxy_url_for", None)):
        moved.append("client._endpoint.http_session._proxy_config.proxy_url_for")
    return moved


def signed(method: str, url: str, headers: dict[str, str], credentials: Any, region: str,
           data: bytes | None = None, stream_output: bool = False) -> Any:
    """A prepared request signed with SigV4 for S3, its headers a plain dict (urllib3 copies
    the headers of every request: botocore's case-insensitive mapping copies item by item, a
    plain dict at C speed)."""
    request = AWSRequest(method=method, url=url, headers=headers, data=data,
                         stream_output=stream_output)
    S3SigV4Auth(credentials.get_frozen_credentials(), "s3", region).add_auth(request)
    prepared = request.prepare()
    prepared.headers = dict(prepared.headers.items())
    return prepared


def send(client: Any, prepared: Any) -> Any:
    """Send over the client's own HTTP session: an `AWSResponse`. Raises what botocore
    raises for a failed transport (`BotoCoreError`)."""
    return client._endpoint.http_session.send(prepared)


def session_tls(client: Any) -> SessionTls:
    """The TLS and proxy settings of the client's HTTP session."""
    session = client._endpoint.http_session
    proxies = session._proxy_config
    uses_proxy = any(proxies.proxy_url_for(f"{scheme}://host") for scheme in ("http", "https"))
    verify = session._verify
    return SessionTls(ca_bundle=get_cert_path(verify) if verify else None,
                      verify=verify is not False,
                      uses_proxy_or_client_cert=bool(session._cert_file) or uses_proxy)
