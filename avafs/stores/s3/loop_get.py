"""Ranged GETs sent from the daemon's request loop itself, over keep-alive connections of its own.

Why: a cold small file is one GET, and sent from a worker thread it costs the GIL twice
over, handed to the thread and back and then contended by every other fetching thread at
each socket call, on top of urllib3's per-request work in Python. On the request loop
(uvloop) the sockets are driven in C. What is left in Python is kept to a few callbacks: the
request is written as bytes and the answer parsed by httptools (llhttp, in C), because an
HTTP client session's own work per request (its request and response objects, timers,
hooks) was about half of the daemon's CPU for such a GET (docs/optimization-history.md,
"a cold small file's CPU on a quiet machine, and a GET's own cost on the loop").

Connections: at most `max_connections` at a time, each carrying one GET, kept for the next
only after an answer read to its end that did not ask to close it. A kept connection the
store closed while it was idle breaks before any byte of the answer; the GET is then sent
once more on a new connection (a GET may be repeated). Anything else that breaks a
transfer closes its connection and fails the GET.

The pool belongs to the loop it was first used on, and is closed there (`close`), as the
loop ends; a GET asked on another loop answers None, and the caller sends it from a thread
as before. So does a GET the client's own session would send through a proxy or with a
client certificate (botocore_adapter.direct_tls), or over HTTPS with a CA bundle that does
not load. What is sent is the lean path's request (lean.py), signed by the same signer, and
only its expected answer is taken: the caller decides what any other means.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from urllib.parse import urlsplit

import httptools

from . import botocore_adapter, sigv4

log = logging.getLogger(__name__)

Answer = tuple[int, dict[str, str], bytes]
"""Status, headers (names in lower case) and body of an answer."""


class TransferFailed(Exception):
    """A GET's connection could not be made, broke off, or carried an answer that does not
    parse. The message names the cause, never a header of the request."""


class Unreachable(TransferFailed):
    """The store could not be reached: the connection was refused or failed, or it closed
    before any byte of the answer."""


class LoopGets:
    """The keep-alive connections of one asyncio loop. Not thread-safe: every method is
    called on that loop."""

    def __init__(self, client: object, max_connections: int) -> None:
        """`client` is the boto3 client whose session the GETs stand in for."""
        self._client = client
        self._max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._tls: dict[str, ssl.SSLContext | bool | None] = {}

    def _tls_here(self, url: str) -> ssl.SSLContext | bool | None:
        """How to secure `url` on the running loop, or None where this GET is not for it."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._slots = asyncio.Semaphore(self._max_connections)
        elif loop is not self._loop:
            return None
        scheme = url.partition(":")[0]
        if scheme not in self._tls:
            try:
                self._tls[scheme] = botocore_adapter.direct_tls(self._client, url)
            except (OSError, ssl.SSLError) as error:
                # The client's CA bundle cannot be loaded: its own session will say so, in
                # the thread every GET goes to from now on.
                log.info("GETs stay in threads: the CA bundle did not load (%s)", error)
                self._tls[scheme] = None
        return self._tls[scheme]

    async def get(self, url: str, headers: dict[str, str], seconds: float) -> Answer | None:
        """(status, headers, body) of one GET of `url` that ends within `seconds`, the body
        kept only for a 206 (partial content); None where the GET is not for this loop.
        Raises TimeoutError when the answer is late, TransferFailed when the transfer
        fails."""
        tls = self._tls_here(url)
        if tls is None:
            return None
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        request = "".join((f"GET {target} HTTP/1.1\r\nHost: {sigv4.host_header(parts)}\r\n",
                           *(f"{name}: {value}\r\n" for name, value in headers.items()),
                           "\r\n")).encode("latin-1")
        where = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                 tls is not False)
        # A task of its own: a late GET is ended by cancelling the task that waits for it, and
        # a request handler runs in place, under the request loop's own task, until it first
        # waits (the pyfuse3 patch's request loop), so it would cancel the loop instead.
        return await asyncio.get_running_loop().create_task(
            self._get(where, tls, request, seconds))

    async def _get(self, where: tuple[str, int, bool], tls: ssl.SSLContext | bool,
                   request: bytes, seconds: float) -> Answer:
        assert self._slots is not None
        async with asyncio.timeout(seconds), self._slots:
            idle = self._idle.setdefault(where, [])
            if idle:
                try:
                    return await self._exchange(idle.pop(), where, request)
                except Unreachable:
                    pass  # closed by the store while idle: once more, on a new connection
            return await self._exchange(await self._connect(where, tls), where, request)

    async def _connect(self, where: tuple[str, int, bool],
                       tls: ssl.SSLContext | bool) -> _Connection:
        host, port, secured = where
        try:
            _, connection = await asyncio.get_running_loop().create_connection(
                _Connection, host, port, ssl=tls if secured else None,
                server_hostname=host if secured else None)
        except (OSError, ssl.SSLError) as error:
            raise Unreachable(f"cannot connect to {host}:{port}: {error}") from None
        return connection

    async def _exchange(self, connection: _Connection, where: tuple[str, int, bool],
                        request: bytes) -> Answer:
        try:
            answer = await connection.send(request)
        except BaseException:
            connection.close()
            raise
        if connection.reusable:
            self._idle[where].append(connection)
        else:
            connection.close()
        return answer

    async def close(self) -> None:
        """Close the idle connections, on their own loop (a no-op if no GET was sent)."""
        if asyncio.get_running_loop() is self._loop:
            for idle in self._idle.values():
                for connection in idle:
                    connection.close()
            self._idle.clear()


class _Connection(asyncio.Protocol):
    """One connection to the store, carrying one request at a time; its answer is parsed as
    it arrives (httptools calls the `on_*` methods from `data_received`)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[Answer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._answered = False
        self._lost = False
        self.reusable = False

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self._transport is not None and self._answer is None
        answer = self._answer = asyncio.get_running_loop().create_future()
        self._headers, self._body, self._answered, self.reusable = {}, [], False, False
        if self._lost:
            self._fail(Unreachable("the connection was closed"))
        else:
            self._transport.write(request)
        return answer

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        self._answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(TransferFailed(f"the store's answer does not parse: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.reusable = False
        if self._answered:
            self._fail(TransferFailed("the connection broke off during the answer"))
        else:
            self._fail(Unreachable("the store closed the connection before answering"))

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        body = b"".join(self._body) if status == 206 else b""
        self.reusable = self._parser.should_keep_alive() and not self._lost
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_result((status, self._headers, body))

    def _fail(self, error: TransferFailed) -> None:
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(error)
