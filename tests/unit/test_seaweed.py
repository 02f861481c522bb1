"""The SeaweedFS fixture: a real cluster that stores, replicates and survives a lost node.

Checked through boto3 as any S3 client sees it: a bucket is created, objects go in and come
back byte for byte, and with one of the two volume servers killed every object is still
readable from its replica; the server restarted, writes (which need both replicas) work again.
The client retries nothing and waits at most 20 s for an answer, so a put left waiting after an
empty one (see `send_empty_bodies_at_once`) fails the test instead of passing late.
"""

from __future__ import annotations

import hashlib
import os

from botocore.config import Config


def test_cluster_stores_and_reads_through_a_killed_volume_server(seaweed_cluster):
    client = seaweed_cluster.client(Config(read_timeout=20, retries={"total_max_attempts": 1}))
    client.create_bucket(Bucket="replicated")
    objects = {f"dir/{index}.bin": os.urandom(size)
               for index, size in enumerate((0, 1, 100_000, 9 * 2**20 + 7))}
    for key, data in objects.items():
        client.put_object(Bucket="replicated", Key=key, Body=data)
    listed = client.list_objects_v2(Bucket="replicated")["Contents"]
    assert {entry["Key"]: entry["Size"] for entry in listed} == \
        {key: len(data) for key, data in objects.items()}

    seaweed_cluster.kill_volume(0)
    assert seaweed_cluster.volumes[0].process.poll() is not None
    for key, data in objects.items():
        body = client.get_object(Bucket="replicated", Key=key)["Body"].read()
        assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest(), key

    seaweed_cluster.restart_volumes(0)
    client.put_object(Bucket="replicated", Key="after-restart", Body=b"back")
    assert client.get_object(Bucket="replicated", Key="after-restart")["Body"].read() == b"back"
