"""HTTP/1.1 GETs sent on the trio loop that serves FUSE, over httpcore's keep-alive pool.

Why: a cold small file's READ waits on exactly one GET. Sent from a worker thread, that GET
costs a thread hop there and back and, with eight readers, a fight for the GIL at every
socket call; sent on the loop, the wait is an epoll registration. httpcore owns the
connections, the pool and the framing (on trio's own sockets); this module adds the limits
of `StoreLimits` (through the caller's timeouts), a cap on the body, and gives up (returns
None) on anything unexpected, so the caller sends the request again through the thread path,
which owns retries and error reporting.

A pool belongs to the trio run that opened its connections: a new run gets a new pool.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import httpcore
import trio

_BROKEN = (httpcore.NetworkError, httpcore.RemoteProtocolError)
"""The connection broke: most often a kept-alive one the server closed just as it was
reused, so the GET is sent once more (as urllib3 does)."""
_FAILURES = (*_BROKEN, httpcore.TimeoutException, httpcore.ProtocolError,
             httpcore.UnsupportedProtocol)
"""A GET that failed in one of these ways is given up on (its connection is closed)."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes


class _TooLong(Exception):
    """The body is longer than the caller asked for: not the answer expected."""


class LoopHttp:
    def __init__(self, ssl_context: ssl.SSLContext, connect_timeout: float,
                 read_timeout: float, max_idle: int) -> None:
        """`read_timeout` bounds each wait for the server, to send or to receive; at most
        `max_idle` connections are kept open between requests (in flight, any number)."""
        self._ssl_context = ssl_context
        self._max_idle = max_idle
        self._timeouts = {"connect": connect_timeout, "read": read_timeout,
                          "write": read_timeout, "pool": connect_timeout}
        self._pool: httpcore.AsyncConnectionPool | None = None
        self._run: trio.lowlevel.TrioToken | None = None

    async def get(self, url: str, headers: dict[str, str], max_body: int) -> Reply | None:
        """GET `url` with `headers` (a Host header is added unless given); None if the
        connection failed, timed out, or the body was longer than `max_body`."""
        pool = self._pool_of_this_run()
        for attempt in range(2):
            try:
                return await self._exchange(pool, url, headers, max_body)
            except _BROKEN:
                if attempt:
                    return None
            except (*_FAILURES, _TooLong):
                return None
        raise AssertionError("unreachable")

    async def _exchange(self, pool: httpcore.AsyncConnectionPool, url: str,
                        headers: dict[str, str], max_body: int) -> Reply:
        """One request and its whole answer; a response left unread closes its
        connection, a whole one hands it back to the pool."""
        async with pool.stream("GET", url, headers=list(headers.items()),
                               extensions={"timeout": self._timeouts}) as response:
            fields = {name.decode("latin-1").lower(): value.decode("latin-1")
                      for name, value in response.headers}
            if int(fields.get("content-length", 0)) > max_body:
                raise _TooLong()
            chunks: list[bytes] = []
            received = 0
            async for chunk in response.aiter_stream():
                received += len(chunk)
                if received > max_body:
                    raise _TooLong()
                chunks.append(chunk)
        return Reply(response.status, fields,
                     chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def _pool_of_this_run(self) -> httpcore.AsyncConnectionPool:
        """Connections belong to the trio run that opened them; one of another run is
        dropped unclosed (closing it needs that run)."""
        run = trio.lowlevel.current_trio_token()
        if self._pool is None or run is not self._run:
            self._pool = httpcore.AsyncConnectionPool(
                ssl_context=self._ssl_context, max_connections=None,
                max_keepalive_connections=self._max_idle,
                network_backend=httpcore.TrioBackend())
            self._run = run
        return self._pool
