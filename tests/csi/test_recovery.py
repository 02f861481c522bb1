"""Pods keep their data when the driver or a volume's daemon dies (kill -9, no cleanup).

Peers' pods are left with "Transport endpoint is not connected" after such a restart; here
each test kills for real and then reads through the pods' target paths.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

DEAD = (errno.ENOTCONN, errno.ECONNABORTED)


def read_tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def assert_dead(path: Path) -> None:
    with pytest.raises(OSError) as error:
        os.listdir(path)
    assert error.value.errno in DEAD


def test_kill9_of_driver_and_daemon_with_two_published_targets(
        driver, kubelet, start_driver, connect, s3_dataset, mountinfo, kill9):
    attributes = s3_dataset.attributes
    secrets = {"accessKeyId": "AKIAAVAFSRECOVERY01", "secretAccessKey": "recovery-secret"}
    staging = kubelet.stage("pv-data", attributes, secrets=secrets)
    writer = kubelet.target_path("trainer", "pv-data")
    reader = kubelet.target_path("evaluator", "pv-data")
    kubelet.publish("pv-data", writer, attributes)
    kubelet.publish("pv-data", reader, attributes, readonly=True)
    expected = s3_dataset.visible_to_alice()
    assert read_tree(reader) == expected
    old_daemon, [old_mount] = driver.daemon_pid(), mountinfo.at(staging)

    kill9(driver.process.pid)
    kill9(old_daemon)
    assert_dead(writer)
    assert_dead(reader)

    restarted = start_driver()
    assert read_tree(writer) == expected
    assert read_tree(reader) == expected
    [new_mount] = mountinfo.at(staging)
    [writer_mount], [reader_mount] = mountinfo.at(writer), mountinfo.at(reader)
    assert new_mount.device != old_mount.device
    assert writer_mount.device == reader_mount.device == new_mount.device
    assert "rw" in writer_mount.options and "ro" in reader_mount.options
    assert restarted.daemon_pid() != old_daemon
    assert secrets["secretAccessKey"] not in restarted.log()

    kubelet = connect(restarted)
    assert not kubelet.stats("pv-data", reader).volume_condition.abnormal
    kubelet.unpublish("pv-data", writer)
    kubelet.unpublish("pv-data", reader)
    kubelet.unstage("pv-data")
    assert mountinfo.under(kubelet.root) == []


def test_restarted_driver_adopts_a_live_daemon(driver, kubelet, start_driver, file_volume,
                                               mountinfo, kill9):
    staging = kubelet.stage("pv-1", file_volume)
    target = kubelet.target_path("pod", "pv-1")
    kubelet.publish("pv-1", target, file_volume, readonly=True)
    daemon, before = driver.daemon_pid(), mountinfo.under(kubelet.root)

    kill9(driver.process.pid)
    restarted = start_driver()

    assert restarted.daemon_pid() == daemon
    assert mountinfo.under(kubelet.root) == before, "nothing was remounted"
    assert (target / "notes.txt").read_text() == "alice's notes\n"
    assert mountinfo.at(staging)


def test_repair_loop_revives_a_daemon_that_dies_under_a_running_driver(
        start_driver, connect, file_volume, kill9):
    driver = start_driver(repair_interval=0.5)
    kubelet = connect(driver)
    kubelet.stage("pv-1", file_volume)
    target = kubelet.target_path("pod", "pv-1")
    kubelet.publish("pv-1", target, file_volume)
    daemon = driver.daemon_pid()

    kill9(daemon)
    deadline = time.monotonic() + 30
    while True:
        try:
            assert (target / "notes.txt").read_text() == "alice's notes\n"
            break
        except OSError as error:
            assert error.errno in DEAD and time.monotonic() < deadline, error
            time.sleep(0.2)
    assert driver.daemon_pid() != daemon
    assert "restarted" in driver.log() and "rebound" in driver.log()


def test_dead_daemon_shows_in_volume_condition_and_a_republish_repairs_it(
        driver, kubelet, file_volume, kill9):
    kubelet.stage("pv-1", file_volume)
    target = kubelet.target_path("pod", "pv-1")
    kubelet.publish("pv-1", target, file_volume)
    kill9(driver.daemon_pid())

    condition = kubelet.stats("pv-1", target).volume_condition
    assert condition.abnormal and "ENOTCONN" in condition.message

    kubelet.publish("pv-1", target, file_volume)
    assert (target / "notes.txt").read_text() == "alice's notes\n"
    assert not kubelet.stats("pv-1", target).volume_condition.abnormal


def test_unstage_of_a_volume_whose_daemon_died(driver, kubelet, file_volume, mountinfo, kill9):
    kubelet.stage("pv-1", file_volume)
    target = kubelet.target_path("pod", "pv-1")
    kubelet.publish("pv-1", target, file_volume)
    kill9(driver.daemon_pid())

    kubelet.unpublish("pv-1", target)
    kubelet.unstage("pv-1")
    assert mountinfo.under(kubelet.root) == []
    assert driver.live_daemons() == [], "the daemon restarted to flush was stopped again"
