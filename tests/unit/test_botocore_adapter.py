"""Every botocore internal the lean S3 path reaches, checked on a real boto3 client against
moto: a botocore release that moves one fails here, by the internal's name."""

from __future__ import annotations

import logging
import ssl

import boto3
import botocore
import pytest

from avafs.stores.s3 import botocore_adapter
from avafs.stores.s3.lean import LeanRequests
from avafs.stores.s3.sigv4 import Signer

DATA = bytes(range(256)) * 40


def _moved(what: str) -> str:
    return (f"botocore {botocore.__version__} changed shape: {what}; update "
            "avafs/stores/s3/botocore_adapter.py")


@pytest.fixture
def client(s3_server, s3_env):
    return boto3.session.Session().client("s3", endpoint_url=s3_server.endpoint)


def test_the_client_has_every_internal_the_adapter_names(client):
    assert botocore_adapter.moved_internals(client) == [], _moved("see the names listed")


def test_a_signed_ranged_get_streams_through_the_clients_session(client, bucket, s3_server):
    client.put_object(Bucket=bucket, Key="sample", Body=DATA)
    url = f"{s3_server.endpoint}/{bucket}/sample"
    session = boto3.session.Session()

    headers = Signer(session.get_credentials(), "us-east-1").headers(
        "GET", url, {"Range": "bytes=10-1009"}, None)

    response = botocore_adapter.send(client, botocore_adapter.prepared(
        "GET", url, headers, stream_output=True))

    assert response.status_code == 206, _moved("AWSResponse.status_code")
    assert response.headers["content-length"] == "1000", _moved("AWSResponse.headers")
    raw = response.raw
    assert raw.read(None) == DATA[10:1010], _moved("AWSResponse.raw.read")
    assert raw.length_remaining == 0, _moved("AWSResponse.raw.length_remaining")
    raw.release_conn()


def test_a_signed_get_reads_whole_through_content(client, bucket, s3_server):
    client.put_object(Bucket=bucket, Key="sample", Body=DATA)
    session = boto3.session.Session()

    url = f"{s3_server.endpoint}/{bucket}/sample"
    headers = Signer(session.get_credentials(), "us-east-1").headers("GET", url, {}, None)

    response = botocore_adapter.send(client, botocore_adapter.prepared("GET", url, headers))

    assert (response.status_code, response.content) == (200, DATA), \
        _moved("AWSResponse.content")


def test_a_moved_internal_turns_the_lean_path_off_loudly(client, bucket, caplog):
    client.put_object(Bucket=bucket, Key="sample", Body=DATA)
    client._endpoint.http_session = object()

    with caplog.at_level(logging.WARNING, logger="avafs.stores.s3.lean"):
        lean = LeanRequests(lambda size: client, boto3.session.Session().get_credentials(),
                            bucket)

    assert "client._endpoint.http_session.send" in caplog.text
    assert lean.open("sample", 0, 10, "etag") is None, "every request goes through boto3"


def test_a_connection_around_the_session_is_secured_as_the_sessions_own(monkeypatch):
    """Plain HTTP and a client that verifies nothing need no TLS; HTTPS verifies against the
    client's CA bundle; a proxy or a client certificate, which a connection around the
    session would not use, rule such a connection out."""
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    session = boto3.session.Session(region_name="us-east-1")
    url = "https://s3.us-east-1.amazonaws.com/bucket/key"
    verifying = session.client("s3")
    unverified = session.client("s3", verify=False)
    certified = session.client("s3", config=botocore.config.Config(
        client_cert=("/nonexistent/cert.pem", "/nonexistent/key.pem")))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    proxied = session.client("s3")

    tls = botocore_adapter.direct_tls(verifying, url)
    assert isinstance(tls, ssl.SSLContext) and tls.verify_mode == ssl.CERT_REQUIRED, \
        _moved("http_session._verify")
    assert botocore_adapter.direct_tls(verifying, "http://127.0.0.1:9000/bucket/key") is False
    assert botocore_adapter.direct_tls(unverified, url) is False, _moved("http_session._verify")
    assert botocore_adapter.direct_tls(certified, url) is None, _moved("http_session._cert_file")
    assert botocore_adapter.direct_tls(proxied, url) is None, _moved("http_session._proxy_config")
