"""The fault proxy's "link" mode, which bench/cluster_tier.py puts between the nodes and their
origin as a cloud link: one bandwidth shared by every connection, and a round trip's delay
before each answer."""

from __future__ import annotations

import threading
import time

import boto3
from support import TEST_CREDENTIALS

MiB = 2**20
RATE = 4_000_000
LATENCY = 0.3


def test_the_link_is_shared_by_every_connection_and_delays_each_answer(s3_server, bucket,
                                                                       proxy):
    s3_server.client().put_object(Bucket=bucket, Key="object", Body=b"x" * (2 * MiB))
    proxy.rate, proxy.latency, proxy.mode = RATE, LATENCY, "link"
    client = boto3.client("s3", endpoint_url=proxy.endpoint, region_name="us-east-1",
                          aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    started = time.monotonic()
    client.head_object(Bucket=bucket, Key="object")
    assert LATENCY <= time.monotonic() - started < LATENCY + 2

    sizes: list[int] = []

    def get() -> None:
        sizes.append(len(client.get_object(Bucket=bucket, Key="object")["Body"].read()))

    readers = [threading.Thread(target=get) for _ in range(2)]
    started = time.monotonic()
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    elapsed = time.monotonic() - started
    assert sizes == [2 * MiB, 2 * MiB]
    assert 4 * MiB / RATE <= elapsed < 4 * MiB / RATE + 3, "two GETs share one link's rate"
    assert proxy.received_from_upstream >= 4 * MiB
