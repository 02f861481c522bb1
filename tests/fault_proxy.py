"""A TCP proxy between avafs and the S3 server that can refuse connections, answer 503, or
cut every response short, so network faults are injected for real, not mocked."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading

CUT_AFTER = 16 * 1024
"""Bytes of a response (headers included) relayed in "cut" mode before the connection drops."""


class _Handler(socketserver.BaseRequestHandler):
    server: FaultProxy

    def handle(self) -> None:
        mode = self.server.mode
        if mode == "refuse":
            return
        if mode == "503":
            self.request.recv(65536)
            body = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
            self.request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                                 b"application/xml\r\nConnection: close\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
            return
        with socket.create_connection(self.server.upstream) as upstream:
            if mode == "cut":
                upstream.sendall(self.request.recv(65536))
                self.request.sendall(upstream.recv(CUT_AFTER))
                return
            pumps = [threading.Thread(target=_pump, args=(self.request, upstream, self.server),
                                      daemon=True),
                     threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)]
            for pump in pumps:
                pump.start()
            for pump in pumps:
                pump.join()


def _pump(source: socket.socket, target: socket.socket,
          counter: FaultProxy | None = None) -> None:
    """Relay until the source closes; bytes sent upstream are added to `counter`."""
    with contextlib.suppress(OSError):
        while data := source.recv(1 << 16):
            if counter is not None:
                with counter.lock:
                    counter.upstream_bytes += len(data)
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


class FaultProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_port: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = ("127.0.0.1", upstream_port)
        self.mode = "pass"
        self.lock = threading.Lock()
        self.upstream_bytes = 0
        """Bytes relayed from avafs to the server in "pass" mode: what uploads sent."""
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
