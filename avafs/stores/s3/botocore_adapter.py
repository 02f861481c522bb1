"""The one place that reaches past boto3's documented API, for the lean request path.

What it reaches into, and why:
- `client._endpoint.http_session`, a `botocore.httpsession.URLLib3Session`, and its `send`:
  a lean request goes out over the client's own connection pool, so it shares the
  client's keep-alive connections, proxies, CA bundle and timeouts instead of opening a pool
  of its own.
- `botocore.awsrequest.AWSPreparedRequest`, a public name in a module boto3 does not
  document: the request object that session sends.
- the `AWSResponse` that `send` returns: `status_code`, `headers`, `content`, and `raw`, the
  urllib3 response read as a stream.
- `StreamingBody._raw_stream`, the urllib3 response under a boto3 GET's body: the data reads
  enforce a deadline on it (deadlines.py).
- the session's `_verify`, `_cert_file` and `_proxy_config`: the GETs sent from the request
  loop (loop_get.py) verify the store's certificate against the same CA bundle, and are not
  sent where the session would present a client certificate or go through a proxy.

None of this is a promised interface, so a botocore release may move any of it. When it
does, `moved_internals` names what moved, and the caller turns the lean path off for the
mount with a WARNING that says so (every request then goes through boto3, which is slower
but right); the mount is not refused, as boto3 alone serves every request. The tests in
tests/unit/test_botocore_adapter.py check each of these against a real client, so a botocore
that changed shape fails there by name before any user sees the warning.
"""

from __future__ import annotations

import ssl
from typing import Any

from botocore.awsrequest import AWSPreparedRequest
from botocore.httpsession import get_cert_path


def moved_internals(client: Any) -> list[str]:
    """The internals this module relies on that `client` lacks, named as reached; empty
    when botocore still has the expected shape."""
    endpoint = getattr(client, "_endpoint", None)
    if endpoint is None:
        return ["client._endpoint"]
    session = getattr(endpoint, "http_session", None)
    if session is None:
        return ["client._endpoint.http_session"]
    if not callable(getattr(session, "send", None)):
        return ["client._endpoint.http_session.send"]
    return [f"client._endpoint.http_session.{name}"
            for name, present in (("_verify", hasattr(session, "_verify")),
                                  ("_proxy_config.proxy_url_for", callable(getattr(
                                      getattr(session, "_proxy_config", None), "proxy_url_for",
                                      None))))
            if not present]


def prepared(method: str, url: str, headers: dict[str, str], data: bytes | None = None,
             stream_output: bool = False) -> Any:
    """The request as the client's HTTP session sends it, headers already signed (sigv4.py).
    Its headers stay a plain dict: urllib3 copies the headers of every request, and
    botocore's case-insensitive mapping copies item by item where a dict copies at C speed."""
    return AWSPreparedRequest(method, url, headers, data or None, stream_output)


def send(client: Any, prepared: Any) -> Any:
    """Send over the client's own HTTP session: an `AWSResponse`. Raises what botocore
    raises for a failed transport (`BotoCoreError`)."""
    return client._endpoint.http_session.send(prepared)


def raw_stream(body: Any) -> Any:
    """The urllib3 response under a boto3 `StreamingBody`."""
    return body._raw_stream


def direct_tls(client: Any, url: str) -> ssl.SSLContext | bool | None:
    """How a connection to `url` that bypasses the client's session must be secured to be
    what the session's own would be: False for plain HTTP or where the client verifies no
    certificate, else a context that verifies against the client's CA bundle. None where
    the session's own connection would present a client certificate or go through a proxy,
    which a bypass does not reproduce."""
    session = client._endpoint.http_session
    if getattr(session, "_cert_file", None) or session._proxy_config.proxy_url_for(url):
        return None
    if not url.startswith("https:") or session._verify is False:
        return False
    return ssl.create_default_context(cafile=get_cert_path(session._verify))
