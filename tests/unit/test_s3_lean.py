"""The lean S3 request path against real HTTP: what it handles itself, and when it steps aside
for boto3 (the full client keeps retries, redirects and error messages)."""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import http.server
import os
import time
import warnings
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
import botocore.exceptions
import pytest
import uvloop
from botocore.config import Config
from support import TEST_CREDENTIALS, serve_http

from avafs.errors import ObjectChangedError, StoreError
from avafs.stores.base import StoreLimits
from avafs.stores.s3.lean import Changed, LeanRequests
from avafs.stores.s3.loop_get import LoopGets
from avafs.stores.s3.store import S3Store


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """A server that answers every request as S3 does for a bucket in another region."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.requests.append(self.path)
        body = b"<Error><Code>PermanentRedirect</Code></Error>"
        self.send_response(301)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


class _BreakingOff(http.server.BaseHTTPRequestHandler):
    """A server that starts a 1000-byte answer and sends 10 bytes of it; then, for a key
    named "stall", waits past the client's read timeout, and for any other, hangs up."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 10)
        self.wfile.flush()
        if self.path.endswith("/stall"):
            time.sleep(1.0)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def redirecting_endpoint() -> Iterator[str]:
    _Redirecting.requests = []
    yield from serve_http(_Redirecting)


@pytest.fixture
def breaking_off_endpoint() -> Iterator[str]:
    yield from serve_http(_BreakingOff)


def _lean_requests(endpoint: str, config: Config | None = None) -> LeanRequests:
    session = boto3.session.Session(aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                    aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                    region_name="us-east-1")
    client = session.client("s3", endpoint_url=endpoint, config=config)
    return LeanRequests(lambda size: client, session.get_credentials(), "bucket")


def test_a_redirect_hands_every_later_request_to_boto3(redirecting_endpoint):
    lean = _lean_requests(redirecting_endpoint)

    assert lean.open("key", 0, 10, "etag") is None
    assert lean.list_page("", None) is None
    assert len(_Redirecting.requests) == 1, "after the redirect, nothing is sent on the lean path"


@pytest.mark.parametrize("calculation", ["when_supported", "when_required"])
def test_a_put_carries_the_body_checksum_botocore_would_send(s3_server, bucket, calculation):
    """CRC32 where botocore sends checksums by default; Content-MD5 where a store needs the
    older header. S3 refuses a body that fails either; moto records the CRC32 (what this
    checks) but verifies neither."""
    session = boto3.session.Session(region_name="us-east-1")
    client = session.client("s3", endpoint_url=s3_server.endpoint,
                            config=Config(request_checksum_calculation=calculation))
    lean = LeanRequests(lambda size: client, session.get_credentials(), bucket)
    data = b"checkpoint shard " * 1000

    etag = lean.put("shard", data)

    assert etag == hashlib.md5(data).hexdigest()
    head = client.head_object(Bucket=bucket, Key="shard", ChecksumMode="ENABLED")
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    assert head.get("ChecksumCRC32") == (crc if calculation == "when_supported" else None)


def _store_with_sample(s3_server, bucket: str):
    """A store on the bucket's "data/" prefix, with 100,000 random bytes as "sample": the
    store, a boto3 client, the bytes and the sample's ObjectInfo."""
    store = S3Store(bucket, "data", s3_server.endpoint, "us-east-1")
    client = s3_server.client()
    data = os.urandom(100_000)
    client.put_object(Bucket=bucket, Key="data/sample", Body=data)
    return store, client, data, store.head("sample")


def test_a_lean_ranged_get_gets_the_bytes_and_sees_the_object_change(s3_server, bucket):
    store, client, data, info = _store_with_sample(s3_server, bucket)
    requests = len(s3_server.requests())

    first = store.get_range("sample", 10, 1000, info.etag)
    client.put_object(Bucket=bucket, Key="data/sample", Body=b"rewritten")
    with pytest.raises(ObjectChangedError):
        store.get_range("sample", 0, 10, info.etag)

    assert first == data[10:1010]
    assert len(s3_server.requests()) == requests + 3, "one GET each, no boto3 repeat"


def test_a_lean_whole_get_gives_the_bytes_and_the_metadata_boto3_would(s3_server, bucket):
    session = boto3.session.Session(region_name="us-east-1")
    client = session.client("s3", endpoint_url=s3_server.endpoint)
    lean = LeanRequests(lambda size: client, session.get_credentials(), bucket)
    data = os.urandom(50_000)
    client.put_object(Bucket=bucket, Key="blocks/b", Body=data,
                      Metadata={"avafs-size": "50000", "avafs-crc32": "0badcafe"})
    requests = len(s3_server.requests())

    found = lean.get_object("blocks/b", len(data))
    with pytest.raises(Changed):
        lean.get_object("blocks/absent", 1)

    assert found == (data, client.head_object(Bucket=bucket, Key="blocks/b")["Metadata"])
    assert found[1] == {"avafs-size": "50000", "avafs-crc32": "0badcafe"}
    assert len(s3_server.requests()) == requests + 3, "one GET each (and the HEAD)"


def test_a_whole_get_whose_body_breaks_off_steps_aside_and_one_that_stalls_times_out(
        breaking_off_endpoint):
    """The body is read outside botocore's send, so its transport errors are mapped here as
    botocore maps them: a broken transfer goes to boto3, a stalled one is botocore's timeout
    (asking again would only wait again)."""
    lean = _lean_requests(breaking_off_endpoint, Config(read_timeout=0.3))

    assert lean.get_object("blocks/broken", 1000) is None
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        lean.get_object("blocks/stall", 1000)


class _CountedThreads(ThreadPoolExecutor):
    """A pool that counts what it is given to run."""

    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, *args, **kwargs):
        self.submitted += 1
        return super().submit(*args, **kwargs)


def test_a_get_from_the_loop_needs_no_thread_and_sees_the_object_change(s3_server, bucket):
    store, client, data, info = _store_with_sample(s3_server, bucket)
    store.list_dir("")  # the lean path knows the bucket's URL from here on
    threads = _CountedThreads()
    requests = len(s3_server.requests())

    async def read_twice() -> bytes:
        first = await store.get_range_async("sample", 10, 1000, info.etag, threads)
        client.put_object(Bucket=bucket, Key="data/sample", Body=b"rewritten")
        with pytest.raises(ObjectChangedError):
            await store.get_range_async("sample", 0, 10, info.etag, threads)
        await store.close_on_loop()
        return first

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = uvloop.run(read_twice())
        gc.collect()

    assert first == data[10:1010]
    assert threads.submitted == 0
    assert len(s3_server.requests()) == requests + 3, "one GET each (and the PUT)"
    assert not [warning for warning in caught if "nclosed" in str(warning.message)]
    threads.shutdown()


def test_a_get_asked_on_another_loop_runs_in_a_thread(s3_server, bucket):
    """The loop's connections belong to the first loop that sent a GET."""
    store = S3Store(bucket, "", s3_server.endpoint, "us-east-1")
    s3_server.client().put_object(Bucket=bucket, Key="sample", Body=b"0123456789")
    info = store.head("sample")
    store.list_dir("")
    threads = _CountedThreads()

    async def read() -> bytes:
        return await store.get_range_async("sample", 2, 5, info.etag, threads)

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(read()) == b"23456"
        assert threads.submitted == 0
        assert uvloop.run(read()) == b"23456"
        assert threads.submitted == 1
    finally:
        loop.run_until_complete(store.close_on_loop())
        loop.close()
        threads.shutdown()


@pytest.mark.parametrize("mode", ["hang", "reset", "503"])
def test_a_get_from_the_loop_fails_as_a_threads_get_does(s3_server, bucket, proxy, mode):
    """A failed GET sent from the loop counts as the read's first try: the tries after it
    run in a thread, and the read fails with the same error within the same bound."""
    limits = StoreLimits(timeout=1.0)
    store = S3Store(bucket, "", proxy.endpoint, "us-east-1", limits=limits)
    s3_server.client().put_object(Bucket=bucket, Key="sample", Body=os.urandom(50_000))
    info = store.head("sample")
    store.list_dir("")
    threads = _CountedThreads()
    proxy.mode = mode

    async def read() -> tuple[Exception, float]:
        started = time.monotonic()
        with pytest.raises(StoreError) as failed:
            await store.get_range_async("sample", 0, 50_000, info.etag, threads)
        await store.close_on_loop()
        return failed.value, time.monotonic() - started

    error, seconds = uvloop.run(read())
    with pytest.raises(StoreError) as in_threads:
        S3Store(bucket, "", proxy.endpoint, "us-east-1", limits=limits).get_range(
            "sample", 0, 50_000, info.etag)

    assert str(error) == str(in_threads.value)
    assert threads.submitted == 1
    assert seconds < 2 * limits.for_size(2**20) + 2.0  # two tries, and thread scheduling
    threads.shutdown()


def test_a_reset_connection_is_described_alike_whichever_way_its_race_went():
    """A server that resets a connection it accepted fails the request at its send or
    before its answer, as the race goes; the "reset" case above once failed on the two
    messages differing."""
    store = S3Store("bucket", "", "http://127.0.0.1:9", "us-east-1")
    failed_send = botocore.exceptions.EndpointConnectionError(endpoint_url=store.endpoint)
    closed_early = botocore.exceptions.ConnectionClosedError(endpoint_url=store.endpoint)
    assert store._describe(closed_early) == store._describe(failed_send)
    assert store._describe(closed_early).startswith("cannot reach S3 endpoint")


def test_a_ca_bundle_that_does_not_load_leaves_the_get_to_a_thread(s3_server, bucket,
                                                                   monkeypatch, tmp_path):
    """The store's own session reports the missing bundle; the loop does not fail the read
    with an error of its own."""
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "absent.pem"))
    client = boto3.session.Session(region_name="us-east-1").client(
        "s3", endpoint_url="https://127.0.0.1:1")
    gets = LoopGets(client, 4)

    async def get() -> object:
        answer = await gets.get("https://127.0.0.1:1/bucket/key", {}, 1.0)
        await gets.close()
        return answer

    assert uvloop.run(get()) is None
