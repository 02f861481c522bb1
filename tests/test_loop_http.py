"""The FUSE loop's HTTP client (httpcore's pool on trio) against real servers on loopback:
keep-alive, a pooled connection the server closed meanwhile, `Connection: close`, timeouts,
oversize bodies, TLS, a second trio run."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from avafs.stores.s3.loop_http import LoopHttp, Reply

BODY = b"sample bytes " * 1000


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers GET with BODY over HTTP/1.1 keep-alive; the server's `mode` bends that."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        server = self.server
        server.requests.append((self.client_address, self.headers.get("Host"),
                                self.headers.get("X-Probe")))
        if server.mode == "slow":
            time.sleep(1.0)
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        if server.mode == "close":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(BODY)
        # "drop": keep-alive was promised, but the server closes the idle connection anyway,
        # as S3 does after a while.
        self.close_connection = server.mode in ("close", "drop")

    def log_message(self, *args: object) -> None:
        return


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.mode = "keep"
        self.requests: list[tuple[tuple[str, int], str, str]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def connections(self) -> int:
        return len({address for address, _, _ in self.requests})


@pytest.fixture
def server() -> Iterator[_Server]:
    server = _Server()
    yield server
    server.shutdown()
    server.server_close()


def _client(context: ssl.SSLContext | None = None, read_timeout: float = 5.0) -> LoopHttp:
    return LoopHttp(context or ssl.create_default_context(), 5.0, read_timeout, 8)


def _gets(client: LoopHttp, url: str, count: int, max_body: int = len(BODY)) -> list[Reply]:
    async def main() -> list[Reply]:
        return [await client.get(url, {"X-Probe": str(n)}, max_body) for n in range(count)]
    return trio.run(main)


def _url(server: _Server, scheme: str = "http", host: str = "127.0.0.1") -> str:
    return f"{scheme}://{host}:{server.server_address[1]}/bucket/key?x=1"


def test_requests_share_one_kept_alive_connection(server):
    replies = _gets(_client(), _url(server), 3)

    assert [(reply.status, reply.body) for reply in replies] == [(200, BODY)] * 3
    assert replies[0].headers["content-length"] == str(len(BODY))
    assert server.connections == 1
    assert [probe for _, _, probe in server.requests] == ["0", "1", "2"]
    assert server.requests[0][1] == f"127.0.0.1:{server.server_address[1]}"


def test_a_pooled_connection_the_server_closed_is_replaced(server):
    server.mode = "drop"

    replies = _gets(_client(), _url(server), 3)

    assert [reply.body for reply in replies] == [BODY] * 3
    assert server.connections == 3
    assert len(server.requests) == 3, "each GET reached the server once"


def test_a_new_trio_run_opens_new_connections(server):
    """Sockets belong to the run that opened them: the second run cannot reuse the first's."""
    client = _client()

    first, second = _gets(client, _url(server), 2), _gets(client, _url(server), 2)

    assert [reply.body for reply in first + second] == [BODY] * 4
    assert server.connections == 2


def test_connection_close_is_not_pooled(server):
    server.mode = "close"

    assert [reply.body for reply in _gets(_client(), _url(server), 2)] == [BODY] * 2
    assert server.connections == 2


def test_a_body_longer_than_asked_for_is_given_up(server):
    assert _gets(_client(), _url(server), 1, max_body=len(BODY) - 1) == [None]


def test_a_slow_answer_times_out(server):
    server.mode = "slow"

    started = time.monotonic()
    assert _gets(_client(read_timeout=0.2), _url(server), 1) == [None]
    assert time.monotonic() - started < 0.9


def test_a_refused_connection_is_none():
    with _Server() as closed:
        url = _url(closed)
        closed.shutdown()
    assert _gets(_client(), url, 1) == [None]


@pytest.fixture
def certificate(tmp_path) -> tuple[Path, Path]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def test_https_verifies_the_servers_certificate(certificate):
    key, cert = certificate
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    server = _Server(server_context)
    try:
        url = _url(server, "https", "localhost")
        trusted = _gets(_client(ssl.create_default_context(cafile=cert)), url, 2)
        untrusted = _gets(_client(ssl.create_default_context()), url, 1)
    finally:
        server.shutdown()
        server.server_close()

    assert [reply.body for reply in trusted] == [BODY] * 2
    assert untrusted == [None], "a certificate no CA vouches for is refused"
