"""Writes through pod volumes reach the bucket, survive kill -9 of the driver and the daemon,
and a warmup works through a pod's subPath bind mount."""

from __future__ import annotations

import os
from pathlib import Path

from avafs.client import Client

SECRETS = {"accessKeyId": "AKIAWRITER", "secretAccessKey": "writer-secret"}


def write_durably(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def store_bytes(s3_server, bucket: str, key: str) -> bytes:
    return s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def test_writes_through_a_target_reach_the_bucket(kubelet, s3_server, s3_dataset, bucket):
    attributes = s3_dataset.attributes
    kubelet.stage("pv-w", attributes, secrets=SECRETS)
    writer = kubelet.target_path("trainer", "pv-w")
    reader = kubelet.target_path("evaluator", "pv-w")
    kubelet.publish("pv-w", writer, attributes)
    kubelet.publish("pv-w", reader, attributes, readonly=True)
    checkpoint = os.urandom(5 * 2**20 + 3)
    write_durably(writer / "ckpt" / "step-100.pt", checkpoint)
    assert (reader / "ckpt" / "step-100.pt").read_bytes() == checkpoint
    kubelet.unpublish("pv-w", writer)
    kubelet.unpublish("pv-w", reader)
    kubelet.unstage("pv-w")
    assert store_bytes(s3_server, bucket, "team/alice/ckpt/step-100.pt") == checkpoint


def test_no_acknowledged_write_is_lost_when_driver_and_daemon_are_killed(
        driver, kubelet, start_driver, connect, s3_server, s3_dataset, bucket, kill9):
    attributes = s3_dataset.attributes
    kubelet.stage("pv-w", attributes, secrets=SECRETS)
    writer = kubelet.target_path("trainer", "pv-w")
    reader = kubelet.target_path("evaluator", "pv-w")
    kubelet.publish("pv-w", writer, attributes)
    kubelet.publish("pv-w", reader, attributes, readonly=True)
    acknowledged = {f"ckpt/step-{step}.pt": os.urandom(2**20 + step) for step in range(3)}
    for name, data in acknowledged.items():
        write_durably(writer / name, data)
    kill9(driver.process.pid)
    kill9(driver.daemon_pid())
    restarted = start_driver()
    for name, data in acknowledged.items():
        assert (writer / name).read_bytes() == data
        assert (reader / name).read_bytes() == data
    kubelet = connect(restarted)
    kubelet.unpublish("pv-w", writer)
    kubelet.unpublish("pv-w", reader)
    kubelet.unstage("pv-w")
    for name, data in acknowledged.items():
        assert store_bytes(s3_server, bucket, f"team/alice/{name}") == data


def test_warmup_through_a_subpath_target(kubelet, s3_server, s3_dataset):
    attributes = s3_dataset.attributes
    kubelet.stage("pv-warm", attributes, secrets=SECRETS)
    target = kubelet.target_path("trainer", "pv-warm")
    kubelet.publish("pv-warm", target, attributes, readonly=True)
    client = Client.for_path(target / "images")
    state = client.warmup([target / "images"])
    assert (state["files_done"], state["files_failed"]) == (1, 0)
    assert state["bytes_done"] == len(s3_dataset.objects["team/alice/images/0001.bin"])
    kubelet.unpublish("pv-warm", target)
    kubelet.unstage("pv-warm")
