"""A TCP proxy between avafs and the S3 server that injects network faults for real, not
mocked. Modes (set `mode` at any time; it applies to connections accepted from then on; "hang" and
"slow" also to the connections being relayed, and a switch to any other fault resets those, so
no kept-alive connection slips past it):

- "pass": relay both ways.
- "refuse": nothing listens on the port (connect() gets ECONNREFUSED).
- "reset": accept, then reset the connection (RST) without answering.
- "hang": accept and read requests, never answer (a store that is up but stuck).
- "slow": relay, answers and requests limited to `rate` bytes per second each way.
- "link": a link to a distant store (the cloud): relay, every connection's bytes together
  limited to `rate` bytes per second, and each answer held `latency` seconds before it starts
  (one round trip per request).
- "slow-list": relay, and hold each answer to a LIST (ListObjectsV2) `latency` seconds before
  it starts (a store whose listings are slow, its other requests quick).
- "hold-create": relay, but never the answers to CreateMultipartUpload: the store starts the
  upload and the client never learns its id (`held` counts them).
- "503" (any 5xx code as text): answer every request with that status and an S3 error body.
- "cut": relay the request, then only the first CUT_AFTER bytes of the answer, then close.
- "trickle": relay requests and the answer's headers, then its body TRICKLE_BYTES bytes each
  second (a store that keeps a connection alive without ever finishing an answer: every socket
  read gets a byte before its timeout).

`faults` counts the connections a fault was injected on (refused connects are not seen);
`sent_upstream` the bytes relayed to the server (requests and uploaded data),
`received_from_upstream` the bytes relayed back from it (answers and downloaded data),
`connections` the client connections open through the proxy now.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

CUT_AFTER = 16 * 1024
"""Bytes of a response (headers included) relayed in "cut" mode before the connection drops."""
TRICKLE_BYTES = 4
"""Bytes of an answer's body relayed per second in "trickle" mode."""
_CHUNK = 1 << 16
_HEADERS_END = b"\r\n\r\n"


class FaultProxy:
    def __init__(self, upstream_port: int, rate: int = 256 * 1024, latency: float = 0.0
                 ) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = rate
        self.latency = latency
        self.faults = 0
        self.sent_upstream = 0
        self.received_from_upstream = 0
        self.held = 0
        self._mode = "pass"
        self._lock = threading.Lock()
        self._closed = False
        self._listener: socket.socket | None = None
        self._relayed: set[socket.socket] = set()
        self._link_free_at = 0.0
        """When the shared link ("link" mode) has sent every byte handed to it so far."""
        self._port = 0
        self._open_listener()
        self.endpoint = f"http://127.0.0.1:{self._port}"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        with self._lock:
            self._mode = mode
            if mode not in ("pass", "hang", "slow", "link", "trickle", "slow-list",
                            "hold-create"):
                for connection in self._relayed:
                    _reset(connection)
            if mode == "refuse":
                self._close_listener()
            elif self._listener is None:
                self._open_listener()

    @property
    def connections(self) -> int:
        """Client connections open through the proxy now (idle kept-alive ones included)."""
        with self._lock:
            return len(self._relayed)

    def _open_listener(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._port))
        listener.listen(128)
        self._port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _count(self) -> None:
        with self._lock:
            self.faults += 1

    def _handle(self, client: socket.socket) -> None:
        with client:
            mode = self._mode
            if mode != "pass":
                self._count()
            if mode == "reset":
                _reset(client)
                return
            if mode == "hang":
                self._hang(client)
                return
            if mode.isdigit():
                self._answer(client, int(mode))
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                return
            with upstream:
                if mode == "cut":
                    with contextlib.suppress(OSError):
                        upstream.sendall(client.recv(_CHUNK))
                        client.sendall(upstream.recv(CUT_AFTER))
                    return
                with self._lock:
                    self._relayed.add(client)
                asked, request = threading.Event(), [""]
                pumps = [threading.Thread(target=self._pump,
                                          args=(client, upstream, True, asked, request),
                                          daemon=True),
                         threading.Thread(target=self._pump,
                                          args=(upstream, client, False, asked, request),
                                          daemon=True)]
                for pump in pumps:
                    pump.start()
                for pump in pumps:
                    pump.join()
                with self._lock:
                    self._relayed.discard(client)

    def _hang(self, client: socket.socket) -> None:
        """Read whatever comes and never answer, until the client gives up or the proxy
        closes."""
        client.settimeout(0.5)
        while not self._closed:
            try:
                if not client.recv(_CHUNK):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    @staticmethod
    def _answer(client: socket.socket, status: int) -> None:
        with contextlib.suppress(OSError):
            client.recv(_CHUNK)
            body = (f"<Error><Code>Injected{status}</Code><Message>injected by the fault proxy"
                    "</Message></Error>").encode()
            client.sendall(f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\n"
                           f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                           + body)

    def _pump(self, source: socket.socket, target: socket.socket, upward: bool,
              asked: threading.Event, request: list[str]) -> None:
        """Relay one direction; in "slow" mode at `rate` bytes per second, in "link" mode
        through the shared link, and in "hang" mode (switched on while the connection is
        open) not at all. `asked` is set by the request side and cleared by the first bytes
        of the answer, which "link" mode holds back for `latency` seconds; `request` holds
        the kind of the last request ("list", "create" or ""), whose answer "slow-list" and
        "hold-create" modes hold back."""
        with contextlib.suppress(OSError):
            while data := source.recv(_CHUNK):
                while self._mode == "hang" and not self._closed:
                    time.sleep(0.2)
                with self._lock:
                    if upward:
                        self.sent_upstream += len(data)
                    else:
                        self.received_from_upstream += len(data)
                if upward:
                    asked.set()
                    request[0] = _kind(data)
                elif self._mode == "trickle":
                    self._trickle(target, data, asked)
                    continue
                elif asked.is_set():
                    asked.clear()
                    if self._mode == "hold-create" and request[0] == "create":
                        self._hold()
                        return
                    if self._mode == "link" or (self._mode == "slow-list"
                                                and request[0] == "list"):
                        time.sleep(self.latency)
                if self._mode == "link":
                    self._send_through_link(target, data)
                elif self._mode == "slow":
                    for start in range(0, len(data), max(1, self.rate // 10)):
                        piece = data[start:start + max(1, self.rate // 10)]
                        target.sendall(piece)
                        time.sleep(len(piece) / self.rate)
                else:
                    target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def _hold(self) -> None:
        """Keep an answer back for good: until the proxy closes."""
        with self._lock:
            self.held += 1
        while not self._closed:
            time.sleep(0.2)

    def _trickle(self, target: socket.socket, data: bytes, asked: threading.Event) -> None:
        """Send an answer's headers (the data up to the first blank line after a request)
        whole, and the rest TRICKLE_BYTES a second while the mode stays "trickle"."""
        if asked.is_set() and _HEADERS_END in data:
            asked.clear()
            end = data.index(_HEADERS_END) + len(_HEADERS_END)
            target.sendall(data[:end])
            data = data[end:]
        for start in range(0, len(data), TRICKLE_BYTES):
            if self._mode != "trickle" or self._closed:
                target.sendall(data[start:])
                return
            target.sendall(data[start:start + TRICKLE_BYTES])
            time.sleep(1.0)

    def _send_through_link(self, target: socket.socket, data: bytes) -> None:
        """Send `data` once the shared link has had the time to carry it after every byte
        handed to it before (by any connection, either way), in pieces of a hundredth of a
        second of the link."""
        piece_size = max(1, self.rate // 100)
        for start in range(0, len(data), piece_size):
            piece = data[start:start + piece_size]
            with self._lock:
                now = time.monotonic()
                self._link_free_at = max(now, self._link_free_at) + len(piece) / self.rate
                wait = self._link_free_at - now
            time.sleep(wait)
            target.sendall(piece)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._close_listener()


def _kind(request: bytes) -> str:
    """"list" for bytes that begin a ListObjectsV2 request, "create" for a
    CreateMultipartUpload, else ""."""
    line = request.split(b"\r\n", 1)[0]
    if line.startswith(b"GET ") and b"list-type=2" in line:
        return "list"
    if line.startswith(b"POST ") and (b"?uploads " in line or b"?uploads&" in line
                                      or b"&uploads" in line):
        return "create"
    return ""


def _reset(connection: socket.socket) -> None:
    """End the connection with a RST, as a crashed or rebooted server's kernel would."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.shutdown(socket.SHUT_RDWR)
