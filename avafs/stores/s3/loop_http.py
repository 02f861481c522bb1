"""HTTP/1.1 GETs sent on the trio loop that serves FUSE, over a keep-alive pool of its own.

Why: a cold small file's READ waits on exactly one GET. Sent from a worker thread, that GET
costs a thread hop there and back and, with several readers, the fetching threads contend for
the GIL at every socket call; sent on the loop, the wait is an epoll registration and no
thread is woken (measured in docs/optimization-history.md). h11 frames the messages; this
module owns the sockets, the pool and the timeouts, and gives up (returns None) on anything
unexpected, so the caller sends the request again through the thread path, which owns
retries and error reporting.
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

_DEFAULT_PORTS = {"http": 80, "https": 443}
_RECEIVE_SIZE = 256 * 1024
_FAILURES = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
             h11.ProtocolError)
"""A connection that failed in one of these ways is closed and the request given up on."""

Origin = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes


class _TooLong(Exception):
    """The body is longer than the caller asked for: not the answer expected."""


class _Connection:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.protocol = h11.Connection(h11.CLIENT)

    def close_now(self) -> None:
        """Close without awaiting (a TLS close_notify is not owed to a failed peer)."""
        stream = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        stream.socket.close()


class LoopHttp:
    def __init__(self, ssl_context: ssl.SSLContext, connect_timeout: float,
                 read_timeout: float, max_idle: int) -> None:
        self._ssl_context = ssl_context
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._run: object | None = None

    async def get(self, url: str, headers: dict[str, str], max_body: int) -> Reply | None:
        """GET `url` with `headers` (a Host header is added unless given); None if the
        connection failed, timed out, or the body was longer than `max_body`. A GET that
        fails on a kept-alive connection (most often one the server has closed meanwhile) is
        sent once more on a new one, as urllib3 does."""
        self._forget_other_runs()
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            return None
        origin = (parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme])
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        fields = list(headers.items())
        if not any(name.lower() == "host" for name, _ in fields):
            fields.insert(0, ("Host", _host_header(origin)))
        request = h11.Request(method="GET", target=target or "/", headers=fields)
        connection = self._take_idle(origin)
        if connection is not None:
            reply = await self._exchange(origin, connection, request, max_body)
            if reply is not None:
                return reply
        try:
            connection = await self._connect(origin)
        except _FAILURES:
            return None
        return await self._exchange(origin, connection, request, max_body)

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        with trio.fail_after(self._connect_timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if scheme == "https":
                stream = trio.SSLStream(stream, self._ssl_context, server_hostname=host,
                                        https_compatible=True)
                try:
                    await stream.do_handshake()
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        return _Connection(stream)

    async def _exchange(self, origin: Origin, connection: _Connection, request: h11.Request,
                        max_body: int) -> Reply | None:
        """One request and its whole answer, the connection then pooled or closed; None (and
        the connection closed) on failure."""
        protocol = connection.protocol
        try:
            with trio.fail_after(self._read_timeout):
                await connection.stream.send_all(protocol.send(request)
                                                 + protocol.send(h11.EndOfMessage()))
            response: h11.Response | None = None
            body: list[bytes] = []
            received = 0
            while True:
                event = protocol.next_event()
                if event is h11.NEED_DATA:
                    with trio.fail_after(self._read_timeout):
                        data = await connection.stream.receive_some(_RECEIVE_SIZE)
                    protocol.receive_data(data)
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    received += len(event.data)
                    if received > max_body:
                        raise _TooLong()
                    body.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    raise trio.BrokenResourceError("the server closed the connection")
        except (*_FAILURES, _TooLong):
            connection.close_now()
            return None
        self._keep_or_close(origin, connection)
        return Reply(response.status_code,
                     {name.decode("latin-1"): value.decode("latin-1")
                      for name, value in response.headers},
                     body[0] if len(body) == 1 else b"".join(body))

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        self._idle_count -= 1
        return idle.pop()

    def _keep_or_close(self, origin: Origin, connection: _Connection) -> None:
        """Pooled if both sides may go on (the server did not say `Connection: close`)."""
        protocol = connection.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE and \
                self._idle_count < self._max_idle:
            protocol.start_next_cycle()
            self._idle.setdefault(origin, []).append(connection)
            self._idle_count += 1
        else:
            connection.close_now()

    def _forget_other_runs(self) -> None:
        """Streams belong to the trio run that opened them; a new run starts a new pool."""
        run = trio.lowlevel.current_trio_token()
        if run is self._run:
            return
        for idle in self._idle.values():
            for connection in idle:
                with contextlib.suppress(OSError):
                    connection.close_now()
        self._idle.clear()
        self._idle_count = 0
        self._run = run


def _host_header(origin: Origin) -> str:
    """As SigV4 signs it: the port only when it is not the scheme's default."""
    scheme, host, port = origin
    name = f"[{host}]" if ":" in host else host
    return name if port == _DEFAULT_PORTS[scheme] else f"{name}:{port}"
