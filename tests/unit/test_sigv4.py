"""The lean path's SigV4 signer: header for header what botocore's S3 signer sends for the
same request at the same instant, and accepted by a store that checks signatures."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from unittest import mock

import boto3
import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from avafs.stores.s3.lean import LeanRequests
from avafs.stores.s3.sigv4 import Signer, canonical_query
from bench.servers.seaweed import SeaweedCluster

NOW = datetime(2026, 11, 24, 23, 59, 58)
KEY_ID, SECRET = "AKIDLEANTEST", "lean/secret+key"

REQUESTS = {
    "ranged GET": ("GET", "http://127.0.0.1:8333/bucket/dir/a%20b~c.bin",
                   {"Range": "bytes=0-1023", "If-Match": '"abc123"'}, None),
    "PUT with metadata": ("PUT", "https://bucket.s3.eu-west-1.amazonaws.com/k%C3%A9y",
                          {"Content-Length": "5", "x-amz-checksum-crc32": "NhCmhg==",
                           "x-amz-sdk-checksum-algorithm": "CRC32",
                           "x-amz-meta-avafs-crc32c": "  spaced   value "}, b"hello"),
    "LIST page": ("GET", "http://[::1]:9000/bucket?" + canonical_query(
        {"list-type": "2", "prefix": "my data/+x/", "delimiter": "/",
         "encoding-type": "url", "continuation-token": "a=b/c"}), {}, None),
    "PUT with Content-MD5": ("PUT", "https://store.example/bucket/key",
                             {"Content-Length": "5", "Content-MD5": "XUFAKrxLKna5cZ2REBfFkg=="},
                             b"hello"),
    "PUT over HTTP": ("PUT", "http://127.0.0.1:8333/bucket/key",
                      {"Content-Length": "5", "x-amz-checksum-crc32": "NhCmhg=="}, b"hello"),
    "default port": ("GET", "http://store.local:80/bucket/key", {}, None),
}


def _botocore_headers(method, url, headers, body, credentials, region, when=NOW):
    """What botocore's signer adds to the request as boto3 sends it: an upload's body is
    marked streaming, and its checksum header named, as put_object marks them."""
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    request.context["has_streaming_input"] = bool(body)
    for name in headers:
        if name.startswith("x-amz-checksum-"):
            request.context["checksum"] = {"request_algorithm": {"in": "header", "name": name}}
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=when):
        botocore.auth.S3SigV4Auth(credentials.get_frozen_credentials(), "s3",
                                  region).add_auth(request)
    return dict(request.headers.items())


@pytest.mark.parametrize("token", [None, "session-token"], ids=["keys", "temporary"])
@pytest.mark.parametrize("name", REQUESTS)
def test_every_lean_request_is_signed_as_botocore_signs_it(name, token):
    credentials = Credentials(KEY_ID, SECRET, token)
    method, url, headers, body = REQUESTS[name]

    ours = Signer(credentials, "eu-west-1").headers(method, url, headers, body, now=NOW)

    assert ours == _botocore_headers(method, url, headers, body, credentials, "eu-west-1")


def test_the_signing_key_follows_the_day_and_a_rotated_secret():
    credentials = Credentials(KEY_ID, SECRET)
    signer = Signer(credentials, "us-east-1")
    method, url, headers, body = REQUESTS["ranged GET"]

    for when, secret in ((NOW, SECRET), (NOW + timedelta(seconds=5), SECRET),
                         (NOW, "rotated")):
        credentials.secret_key = secret
        assert signer.headers(method, url, headers, body, now=when) == _botocore_headers(
            method, url, headers, body, credentials, "us-east-1", when)


@pytest.fixture(scope="module")
def checking_store(tmp_path_factory):
    """A SeaweedFS whose S3 gateway knows one identity, so it refuses a wrong signature."""
    root = tmp_path_factory.mktemp("seaweed-auth")
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "lean", "credentials": [{"accessKey": KEY_ID, "secretKey": SECRET}],
        "actions": ["Admin", "Read", "List", "Write"]}]}))
    cluster = SeaweedCluster(root / "cluster", volume_servers=1, replication="000",
                             s3_config=config)
    cluster.start()
    try:
        boto3.client("s3", endpoint_url=cluster.endpoint, region_name="us-east-1",
                     aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET).create_bucket(
            Bucket="signed")
        yield cluster
    finally:
        cluster.stop()


def _lean(cluster, secret: str) -> LeanRequests:
    session = boto3.session.Session(aws_access_key_id=KEY_ID, aws_secret_access_key=secret,
                                    region_name="us-east-1")
    client = session.client("s3", endpoint_url=cluster.endpoint)
    return LeanRequests(lambda size: client, session.get_credentials(), "signed")


def test_a_store_that_checks_signatures_accepts_every_lean_request(checking_store):
    lean = _lean(checking_store, SECRET)
    key = "my data/+x/sample é.bin"

    etag = lean.put(key, b"0123456789", {"avafs-crc32c": "abc"})
    assert etag is not None, "the PUT was refused"
    assert lean.open(key, 2, 5, etag).read() == b"23456"
    assert lean.get_object(key, 10) == (b"0123456789", {"avafs-crc32c": "abc"})
    page = lean.list_page("my data/+x/", None)
    assert page is not None and [found.key for found in page.objects] == [key]


def test_a_store_that_checks_signatures_refuses_a_wrong_secret(checking_store):
    wrong = _lean(checking_store, "not-the-secret")

    assert wrong.put("refused.bin", b"data") is None, "a refused lean PUT steps aside"
    assert wrong.list_page("", None) is None
    assert _lean(checking_store, SECRET).put("refused.bin", b"data") is not None, \
        "the same PUT signed with the right secret is taken"
