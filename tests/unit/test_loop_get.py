"""The request loop's own GETs (avafs/stores/s3/loop_get.py) against real HTTP servers on
loopback: connections kept and bounded, a kept one the server closed replaced, a broken
answer failed. How a failed GET becomes the read's error is in test_s3_lean.py."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import boto3
import pytest
import uvloop
from support import serve_http

from avafs.stores.s3.loop_get import LoopGets, TransferFailed, Unreachable

BODY = bytes(range(256)) * 40


class _Ranges(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a 206 of BODY over keep-alive connections, counting the
    connections it accepted; after the GET of a path ending in "/last" it closes the
    connection without saying so in its answer, as a store whose idle timeout ran out."""

    protocol_version = "HTTP/1.1"
    connections = 0
    lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with self.lock:
            type(self).connections += 1

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(206)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("x-amz-meta-twice", "one")
        self.send_header("X-Amz-Meta-Twice", "two")
        self.end_headers()
        self.wfile.write(BODY)
        if self.path.endswith("/last"):
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        return


class _BreakingOff(_Ranges):
    """Sends part of its answer's body, then hangs up."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(206)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY[:100])
        self.close_connection = True


@pytest.fixture
def ranges_endpoint() -> Iterator[str]:
    _Ranges.connections = 0
    yield from serve_http(_Ranges)


@pytest.fixture
def breaking_off_endpoint() -> Iterator[str]:
    yield from serve_http(_BreakingOff)


def _gets(endpoint: str, connections: int) -> LoopGets:
    client = boto3.session.Session(region_name="us-east-1").client("s3", endpoint_url=endpoint)
    return LoopGets(client, connections)


def test_gets_share_kept_connections_never_more_than_the_bound(ranges_endpoint):
    gets = _gets(ranges_endpoint, 2)

    async def many() -> list:
        one_by_one = [await gets.get(f"{ranges_endpoint}/bucket/{n}", {}, 5.0)
                      for n in range(10)]
        side_by_side = await asyncio.gather(*(gets.get(f"{ranges_endpoint}/bucket/{n}", {}, 5.0)
                                              for n in range(20)))
        await gets.close()
        return one_by_one + side_by_side

    answers = uvloop.run(many())

    assert [(status, body) for status, _, body in answers] == [(206, BODY)] * 30
    assert answers[0][1]["content-length"] == str(len(BODY))
    assert answers[0][1]["x-amz-meta-twice"] == "one, two"
    assert _Ranges.connections <= 2


def test_a_kept_connection_the_store_closed_is_replaced_once(ranges_endpoint):
    gets = _gets(ranges_endpoint, 4)

    async def after_the_close() -> list:
        answers = [await gets.get(f"{ranges_endpoint}/bucket/last", {}, 5.0)]
        await asyncio.sleep(0.2)  # the server's close has arrived: the kept connection is dead
        answers.append(await gets.get(f"{ranges_endpoint}/bucket/next", {}, 5.0))
        await gets.close()
        return answers

    answers = uvloop.run(after_the_close())

    assert [body for _, _, body in answers] == [BODY, BODY]
    assert _Ranges.connections == 2


def test_an_answer_that_breaks_off_fails_the_get_and_no_server_fails_it_as_unreachable(
        breaking_off_endpoint):
    gets = _gets(breaking_off_endpoint, 4)

    async def broken() -> tuple[Exception, Exception]:
        with pytest.raises(TransferFailed) as partial:
            await gets.get(f"{breaking_off_endpoint}/bucket/key", {}, 5.0)
        with pytest.raises(Unreachable) as refused:
            await gets.get("http://127.0.0.1:9/bucket/key", {}, 5.0)
        await gets.close()
        return partial.value, refused.value

    partial, refused = uvloop.run(broken())

    assert not isinstance(partial, Unreachable)
    assert "broke off" in str(partial)
    assert "127.0.0.1:9" in str(refused)
