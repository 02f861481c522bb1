"""A pod's volume from start to end, driven over the plugin's socket like kubelet drives it."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_port

from csi_driver.proto import csi_pb2

MODE = csi_pb2.VolumeCapability.AccessMode
SECRETS = {"accessKeyId": "AKIAAVAFSCSITEST0001",
           "secretAccessKey": "avafs-csi-secret-VALUE-never-logged",
           "sessionToken": "avafs-csi-session-TOKEN-never-logged"}


def read_tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def all_command_lines() -> list[bytes]:
    """What `ps` shows any user: every process's /proc/PID/cmdline."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return lines


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_kubelet_flow_against_s3_each_call_twice(kubelet, driver, s3_dataset, mountinfo):
    attributes = s3_dataset.attributes
    for _ in range(2):
        staging = kubelet.stage("pv-alice", attributes, secrets=SECRETS)
    [staged] = mountinfo.at(staging)
    assert staged.fstype == "fuse.avafs" and staged.root == "/"

    writer = kubelet.target_path("pod-a", "pv-alice")
    reader = kubelet.target_path("pod-b", "pv-alice")
    for _ in range(2):
        kubelet.publish("pv-alice", writer, attributes)
        kubelet.publish("pv-alice", reader, attributes, readonly=True)

    expected = s3_dataset.visible_to_alice()
    assert read_tree(writer) == expected
    assert read_tree(reader) == expected
    assert not (writer / "private.txt").exists() and sorted(os.listdir(writer)) == [
        "images", "labels.txt"]

    [writer_mount], [reader_mount] = mountinfo.at(writer), mountinfo.at(reader)
    for mount in (writer_mount, reader_mount):
        assert (mount.fstype, mount.device, mount.root) == ("fuse.avafs", staged.device,
                                                            "/team/alice")
        assert {"nosuid", "nodev"} <= set(mount.options)
    assert "rw" in writer_mount.options and "ro" in reader_mount.options
    with pytest.raises(OSError) as refused:
        (reader / "new.txt").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS

    for path in (writer, reader, staging):
        stats = kubelet.stats("pv-alice", path)
        units = {usage.unit: usage for usage in stats.usage}
        assert units[csi_pb2.VolumeUsage.BYTES].total >= units[csi_pb2.VolumeUsage.BYTES].used
        assert not stats.volume_condition.abnormal

    for _ in range(2):
        kubelet.unpublish("pv-alice", writer)
        kubelet.unpublish("pv-alice", reader)
    assert not writer.exists() and not reader.exists()
    assert writer.parent.is_dir(), "the pod's directory belongs to kubelet"

    daemon = driver.daemon_pid()
    for _ in range(2):
        kubelet.unstage("pv-alice")
    assert mountinfo.under(kubelet.root) == []
    assert not Path(f"/proc/{daemon}").exists() or b"avafs" not in Path(
        f"/proc/{daemon}/cmdline").read_bytes()
    assert staging.is_dir(), "kubelet created the staging directory and removes it"
    assert not list((driver.state_dir / "volumes").iterdir())


def test_credentials_reach_only_the_daemons_environment(kubelet, driver, s3_dataset):
    kubelet.stage("pv-secret", s3_dataset.attributes, secrets=SECRETS)
    target = kubelet.target_path("pod", "pv-secret")
    kubelet.publish("pv-secret", target, s3_dataset.attributes)
    assert (target / "labels.txt").read_bytes() == b"cat\ndog\n"

    daemon = driver.daemon_pid()
    environment = Path(f"/proc/{daemon}/environ").read_bytes().split(b"\0")
    assert f"AWS_ACCESS_KEY_ID={SECRETS['accessKeyId']}".encode() in environment
    assert f"AWS_SECRET_ACCESS_KEY={SECRETS['secretAccessKey']}".encode() in environment
    assert f"AWS_SESSION_TOKEN={SECRETS['sessionToken']}".encode() in environment

    places = {"driver log": driver.log().encode(),
              "command lines": b"\n".join(all_command_lines())}
    state_files = [path for path in driver.state_dir.rglob("*") if path.is_file()]
    [credentials_file] = [path for path in state_files if path.name == "credentials.json"]
    for path in state_files:
        # The daemon keeps caching while this runs: a disk-tier block's temporary file can be
        # renamed between the listing and the read; such files hold cached object bytes.
        if path != credentials_file:
            with contextlib.suppress(FileNotFoundError):
                places[str(path)] = path.read_bytes()
    for where, content in places.items():
        for secret in SECRETS.values():
            assert secret.encode() not in content, f"secret found in {where}"
    assert "<redacted>" in driver.log(), "the stage request was logged, masked"
    assert stat.S_IMODE(credentials_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(driver.state_dir.stat().st_mode) == 0o700


def test_conflicting_stage_and_publish_are_already_exists(kubelet, file_volume):
    staging = kubelet.stage("pv-1", file_volume)
    error = rpc_error(lambda: kubelet.stage("pv-1", {**file_volume, "metadataTtl": "5"}))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "other volumeAttributes" in error.details()
    error = rpc_error(lambda: kubelet.stage("pv-1", file_volume, mode=MODE.MULTI_NODE_READER_ONLY))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    error = rpc_error(lambda: kubelet.stage("pv-2", file_volume, staging_path=staging))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "in use by volume pv-1" in error.details()

    target = kubelet.target_path("pod", "pv-1")
    kubelet.publish("pv-1", target, file_volume)
    error = rpc_error(lambda: kubelet.publish("pv-1", target, file_volume, readonly=True))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "readonly=False" in error.details()
    assert (target / "notes.txt").read_text() == "alice's notes\n"


def test_stats_of_a_path_the_volume_is_not_at_is_not_found(kubelet, file_volume, tmp_path):
    kubelet.stage("pv-1", file_volume)
    error = rpc_error(lambda: kubelet.stats("pv-1", tmp_path))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert str(tmp_path) in error.details()
    error = rpc_error(lambda: kubelet.stats("pv-1", Path("some/path")))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_publish_of_a_volume_staged_elsewhere_is_not_found(kubelet, file_volume):
    kubelet.stage("pv-1", file_volume)
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id="pv-1", staging_target_path=str(kubelet.root / "elsewhere"),
        target_path=str(kubelet.target_path("pod", "pv-1")),
        volume_capability=kubelet.capability())
    error = rpc_error(lambda: kubelet.node.NodePublishVolume(request))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "is staged at" in error.details()


def test_read_only_access_mode_mounts_the_daemon_read_only(kubelet, file_volume, mountinfo):
    staging = kubelet.stage("pv-ro", file_volume, mode=MODE.MULTI_NODE_READER_ONLY)
    [staged] = mountinfo.at(staging)
    assert "ro" in staged.options
    target = kubelet.target_path("pod", "pv-ro")
    kubelet.publish("pv-ro", target, file_volume, mode=MODE.MULTI_NODE_READER_ONLY)
    with pytest.raises(OSError) as refused:
        (target / "new.txt").write_text("x")
    assert refused.value.errno == errno.EROFS


def test_namespace_volume_and_sub_path_from_pod_namespace(kubelet, tmp_path):
    for user in ("alice", "bob"):
        home = tmp_path / "homes" / "users" / user
        home.mkdir(parents=True)
        (home / "whoami").write_text(user)
    (tmp_path / "datasets" / "mnist").mkdir(parents=True)
    (tmp_path / "datasets" / "mnist" / "train.bin").write_bytes(b"\x01" * 1000)
    attributes = {"namespace": f"{{home: file://{tmp_path}/homes, data: file://{tmp_path}/datasets}}",
                  "subPath": "home/users/${pod.namespace}", "immutable": "true"}
    staging = kubelet.stage("pv-ns", attributes)
    assert sorted(os.listdir(staging)) == ["data", "home"]
    assert (staging / "data" / "mnist" / "train.bin").read_bytes() == b"\x01" * 1000

    target = kubelet.target_path("pod", "pv-ns")
    pod_info = {"csi.storage.k8s.io/pod.namespace": "bob", "csi.storage.k8s.io/pod.name": "p",
                "csi.storage.k8s.io/pod.uid": "1234", "csi.storage.k8s.io/ephemeral": "false",
                "csi.storage.k8s.io/serviceAccount.name": "default"}
    kubelet.publish("pv-ns", target, {**attributes, **pod_info})
    assert os.listdir(target) == ["whoami"] and (target / "whoami").read_text() == "bob"

    other = kubelet.target_path("pod-without-info", "pv-ns")
    error = rpc_error(lambda: kubelet.publish("pv-ns", other, attributes))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "podInfoOnMount" in error.details()
    assert not other.exists()


def test_missing_sub_path_is_not_found_and_leaves_no_target(kubelet, file_volume, driver):
    kubelet.stage("pv-1", file_volume, mode=MODE.MULTI_NODE_READER_ONLY)
    target = kubelet.target_path("pod", "pv-1")
    error = rpc_error(lambda: kubelet.publish("pv-1", target, {**file_volume,
                                                               "subPath": "users/carol"},
                                              mode=MODE.MULTI_NODE_READER_ONLY))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "users/carol" in error.details()
    assert not target.exists()
    assert not list(driver.state_dir.glob("volumes/*/targets/*.json"))


def test_file_sources_are_refused_unless_enabled(start_driver, connect, file_volume):
    kubelet = connect(start_driver(allow_file_sources=False))
    error = rpc_error(lambda: kubelet.stage("pv-file", file_volume))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--allow-file-sources" in error.details()
    namespace = {"namespace": "{a: s3://bucket, b: file:///var/lib/avafs-csi}"}
    error = rpc_error(lambda: kubelet.stage("pv-file", namespace))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_failed_mount_reports_avafs_error_and_leaves_nothing(kubelet, driver, tmp_path,
                                                             mountinfo):
    missing = tmp_path / "no-such-bucket"
    error = rpc_error(lambda: kubelet.stage("pv-bad", {"source": f"file://{missing}"}))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "avafs mount of volume pv-bad failed" in error.details()
    assert str(missing) in error.details()
    assert mountinfo.under(kubelet.root) == []
    assert not list((driver.state_dir / "volumes").iterdir())


def test_publish_over_a_stale_mount_nobody_recorded(kubelet, file_volume, tmp_path, mountinfo,
                                                    kill9):
    """A target left with a dead FUSE mount (say, by an earlier driver) is taken over."""
    other_bucket = tmp_path / "other-bucket"
    other_bucket.mkdir()
    stale_mountpoint = kubelet.root / "other"
    stale_mountpoint.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "avafs", "mount", f"file://{other_bucket}",
                    str(stale_mountpoint), "--cache-dir", str(tmp_path / "other-cache")],
                   check=True, capture_output=True, timeout=120)
    target = kubelet.target_path("pod", "pv-1")
    target.mkdir()
    subprocess.run(["mount", "--bind", str(stale_mountpoint), str(target)], check=True)
    kill9(int((tmp_path / "other-cache" / "avafs.pid").read_text()))
    with pytest.raises(OSError) as dead:
        os.statvfs(target)
    assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)

    kubelet.stage("pv-1", file_volume)
    kubelet.publish("pv-1", target, file_volume)
    assert (target / "notes.txt").read_text() == "alice's notes\n"
    assert len(mountinfo.at(target)) == 1


def _with_group(capability: csi_pb2.VolumeCapability, group: str) -> csi_pb2.VolumeCapability:
    capability.mount.volume_mount_group = group
    return capability


def test_fs_group_of_the_pod_owns_the_volume_and_a_conflicting_one_is_refused(kubelet,
                                                                             file_volume):
    # The bucket's root: a subdirectory of a file:// bucket shows its local owner and mode.
    file_volume = {**file_volume, "subPath": ""}
    capabilities = kubelet.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    assert csi_pb2.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP in \
        [capability.rpc.type for capability in capabilities.capabilities]
    staging = kubelet.staging_path("pv-group")
    kubelet.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
        volume_id="pv-group", staging_target_path=str(staging), volume_context=file_volume,
        volume_capability=_with_group(kubelet.capability(), "4242")), timeout=150)
    target = kubelet.target_path("pod-a", "pv-group")
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id="pv-group", staging_target_path=str(staging), target_path=str(target),
        volume_context=file_volume, volume_capability=_with_group(kubelet.capability(), "4242"))
    kubelet.node.NodePublishVolume(publish, timeout=150)

    shown = os.stat(target)
    assert (shown.st_gid, stat.S_IMODE(shown.st_mode)) == (4242, 0o775)
    (target / "ckpt.txt").write_text("x")
    assert os.stat(target / "ckpt.txt").st_gid == 4242

    other = kubelet.target_path("pod-b", "pv-group")
    publish.target_path = str(other)
    publish.volume_capability.mount.volume_mount_group = "999"
    error = rpc_error(lambda: kubelet.node.NodePublishVolume(publish, timeout=150))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "fsGroup is 999" in error.details()
def test_metrics_attribute_serves_the_volume_labelled_with_its_id(kubelet, file_volume):
    port = free_port()
    kubelet.stage("pv-metrics", {**file_volume, "metricsAddr": f"127.0.0.1:{port}"})
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    mounts = {sample.labels["mount"] for family in text_string_to_metric_families(text)
              for sample in family.samples}
    assert mounts == {"pv-metrics"}
    kubelet.unstage("pv-metrics")
