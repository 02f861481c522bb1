"""The Controller service over real gRPC: volumes as directories of a moto or file:// bucket.

A driver in `all` mode provisions a volume the way the external-provisioner asks for one,
then serves it to a pod the way kubelet mounts it, and the test looks at the bucket itself.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from csi_driver.proto import csi_pb2

MODE = csi_pb2.VolumeCapability.AccessMode
Service = csi_pb2.PluginCapability.Service
SECRETS = {"accessKeyId": "testing-key-id", "secretAccessKey": "testing-secret-key"}
"""moto's credentials, which the driver (started without AWS variables) gets only this way."""


def capability(mode: int = MODE.MULTI_NODE_MULTI_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                    access_mode=MODE(mode=mode))


def create(kubelet, name: str, parameters: dict[str, str], secrets: dict[str, str] | None = None,
           required_bytes: int = 2**30, mode: int = MODE.MULTI_NODE_MULTI_WRITER
           ) -> csi_pb2.Volume:
    return kubelet.controller.CreateVolume(csi_pb2.CreateVolumeRequest(
        name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=required_bytes),
        volume_capabilities=[capability(mode)], parameters=parameters,
        secrets=SECRETS if secrets is None else secrets), timeout=60).volume


def delete(kubelet, volume_id: str, secrets: dict[str, str] | None = None) -> None:
    kubelet.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(
        volume_id=volume_id, secrets=SECRETS if secrets is None else secrets), timeout=60)


def status_of(call, request) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=60)
    return caught.value.code()


def keys_of(s3_server, bucket: str) -> list[str]:
    listing = s3_server.client().list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listing.get("Contents", []))


@pytest.fixture
def all_mode(start_driver, connect):
    driver = start_driver(mode="all")
    return driver, connect(driver)


def test_all_mode_advertises_the_controller_and_only_create_delete(all_mode):
    _, kubelet = all_mode
    plugin = kubelet.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert [c.service.type for c in plugin.capabilities] == [Service.CONTROLLER_SERVICE]
    controller = kubelet.controller.ControllerGetCapabilities(
        csi_pb2.ControllerGetCapabilitiesRequest())
    assert [c.rpc.type for c in controller.capabilities] == [
        csi_pb2.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME]


def test_a_node_mode_plugin_answers_controller_calls_unimplemented(shared_kubelet):
    assert status_of(shared_kubelet.controller.ControllerGetCapabilities,
                     csi_pb2.ControllerGetCapabilitiesRequest()) == grpc.StatusCode.UNIMPLEMENTED


def test_controller_mode_serves_no_node_calls(start_driver, connect):
    kubelet = connect(start_driver(mode="controller"))
    assert kubelet.identity.Probe(csi_pb2.ProbeRequest()).ready.value
    assert status_of(kubelet.node.NodeGetInfo,
                     csi_pb2.NodeGetInfoRequest()) == grpc.StatusCode.UNIMPLEMENTED


def test_s3_volume_is_created_once_mounted_and_deleted_with_its_objects(
        all_mode, s3_server, bucket):
    driver, kubelet = all_mode
    parameters = {"bucket": f"s3://{bucket}/pvcs", "endpointUrl": s3_server.endpoint,
                  "region": "us-east-1", "ramCache": "64Mi", "reclaim": "delete"}
    volume = create(kubelet, "pvc-0001", parameters)
    assert volume.capacity_bytes == 2**30
    assert volume.volume_context["source"] == f"s3://{bucket}/pvcs/pvc-0001"
    assert volume.volume_context["ramCache"] == "64Mi"
    assert "pvcs/pvc-0001/" in keys_of(s3_server, bucket)
    assert create(kubelet, "pvc-0001", parameters) == volume  # idempotent by name
    for changed in ({"required_bytes": 2**31}, {"parameters": {**parameters, "ramCache": "1Gi"}}):
        arguments = {"parameters": parameters, **changed}
        with pytest.raises(grpc.RpcError) as caught:
            create(kubelet, "pvc-0001", **arguments)
        assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS

    kubelet.stage(volume.volume_id, dict(volume.volume_context), secrets=SECRETS)
    target = kubelet.target_path("writer", "pvc-0001")
    kubelet.publish(volume.volume_id, target, dict(volume.volume_context))
    (target / "checkpoint.bin").write_bytes(b"step 1\n")
    kubelet.unpublish(volume.volume_id, target)
    kubelet.unstage(volume.volume_id)  # uploads what the pod wrote
    assert "pvcs/pvc-0001/checkpoint.bin" in keys_of(s3_server, bucket)

    delete(kubelet, volume.volume_id)
    assert keys_of(s3_server, bucket) == []
    delete(kubelet, volume.volume_id)  # idempotent
    assert SECRETS["secretAccessKey"] not in driver.log()


def test_file_volume_with_retain_keeps_its_objects(all_mode, tmp_path):
    _, kubelet = all_mode
    root = tmp_path / "bucket"
    root.mkdir()
    volume = create(kubelet, "pvc-kept", {"bucket": f"file://{root}/vols"}, secrets={})
    directory = root / "vols" / "pvc-kept"
    assert directory.is_dir()
    (directory / "result.txt").write_text("keep me\n")
    delete(kubelet, volume.volume_id, secrets={})
    assert (directory / "result.txt").read_text() == "keep me\n"
    assert not list((root / "vols" / ".avafs-csi").rglob("*.json"))
    # The record is gone: the name can be created again, with other parameters.
    again = create(kubelet, "pvc-kept", {"bucket": f"file://{root}/vols", "reclaim": "delete"},
                   secrets={})
    delete(kubelet, again.volume_id, secrets={})
    assert not directory.exists()


def test_validate_volume_capabilities(all_mode, tmp_path):
    _, kubelet = all_mode
    volume = create(kubelet, "pvc-valid", {"bucket": f"file://{tmp_path}"}, secrets={})

    def validate(volume_id: str, *modes: int) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        return kubelet.controller.ValidateVolumeCapabilities(
            csi_pb2.ValidateVolumeCapabilitiesRequest(
                volume_id=volume_id, volume_context=volume.volume_context,
                volume_capabilities=[capability(mode) for mode in modes]), timeout=60)

    confirmed = validate(volume.volume_id, MODE.MULTI_NODE_MULTI_WRITER, MODE.SINGLE_NODE_WRITER,
                         MODE.MULTI_NODE_READER_ONLY)
    assert len(confirmed.confirmed.volume_capabilities) == 3
    refused = validate(volume.volume_id, MODE.MULTI_NODE_SINGLE_WRITER)
    assert not refused.HasField("confirmed") and "MULTI_NODE_SINGLE_WRITER" in refused.message
    assert status_of(lambda request, timeout: validate(f"file://{tmp_path}/pvc-none",
                                                       MODE.SINGLE_NODE_WRITER),
                     None) == grpc.StatusCode.NOT_FOUND
    assert status_of(kubelet.controller.ValidateVolumeCapabilities,
                     csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=volume.volume_id)
                     ) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("parameters, mode, named", [
    ({}, MODE.MULTI_NODE_MULTI_WRITER, "bucket"),
    ({"bucket": "http://example.com/x"}, MODE.MULTI_NODE_MULTI_WRITER, "bucket"),
    ({"bucket": "s3://b", "diskCach": "1Gi"}, MODE.MULTI_NODE_MULTI_WRITER, "diskCach"),
    ({"bucket": "s3://b", "diskCache": "lots"}, MODE.MULTI_NODE_MULTI_WRITER, "diskCache"),
    ({"bucket": "s3://b", "source": "s3://c"}, MODE.MULTI_NODE_MULTI_WRITER, "source"),
    ({"bucket": "s3://b", "reclaim": "recycle"}, MODE.MULTI_NODE_MULTI_WRITER, "reclaim"),
    ({"bucket": "s3://b"}, MODE.MULTI_NODE_SINGLE_WRITER, "MULTI_NODE_SINGLE_WRITER"),
], ids=["no bucket", "not a bucket URL", "unknown parameter", "bad size", "static source",
        "bad reclaim", "unsupported access mode"])
def test_bad_requests_are_invalid_arguments_that_name_the_problem(shared_all_mode, parameters,
                                                                   mode, named):
    with pytest.raises(grpc.RpcError) as caught:
        create(shared_all_mode, "pvc-bad", parameters, mode=mode)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in caught.value.details()


def test_missing_name_and_block_volumes_are_refused(shared_all_mode):
    block = csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(),
                                     access_mode=MODE(mode=MODE.SINGLE_NODE_WRITER))
    for request in (csi_pb2.CreateVolumeRequest(volume_capabilities=[capability()],
                                                parameters={"bucket": "s3://b"}),
                    csi_pb2.CreateVolumeRequest(name="pvc-block", volume_capabilities=[block],
                                                parameters={"bucket": "s3://b"}),
                    csi_pb2.CreateVolumeRequest(name="pvc-nocap",
                                                parameters={"bucket": "s3://b"})):
        assert status_of(shared_all_mode.controller.CreateVolume,
                         request) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(shared_all_mode.controller.DeleteVolume,
                     csi_pb2.DeleteVolumeRequest()) == grpc.StatusCode.INVALID_ARGUMENT
    delete(shared_all_mode, "not-an-avafs-volume-id")  # nothing to delete: OK, as CSI says


def test_file_buckets_need_allow_file_sources(start_driver, connect, tmp_path):
    kubelet = connect(start_driver(allow_file_sources=False, mode="controller"))
    with pytest.raises(grpc.RpcError) as caught:
        create(kubelet, "pvc-file", {"bucket": f"file://{tmp_path}"}, secrets={})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--allow-file-sources" in caught.value.details()
    assert not Path(tmp_path, "pvc-file").exists()


def test_a_debug_log_shows_no_credentials_of_the_provisioner_secret(all_mode, s3_server, bucket):
    """The driver runs at --log-level debug here; the S3 client's own debug lines (request
    headers: the signature's key id, the session token) must not reach its log."""
    driver, kubelet = all_mode
    secrets = {"accessKeyId": "AKIAPROVISIONERNEVERLOGGED",
               "secretAccessKey": "provisioner-secret-never-logged",
               "sessionToken": "provisioner-session-token-never-logged"}
    parameters = {"bucket": f"s3://{bucket}/pvcs", "endpointUrl": s3_server.endpoint,
                  "region": "us-east-1", "reclaim": "delete"}
    volume = create(kubelet, "pvc-quiet", parameters, secrets=secrets)
    delete(kubelet, volume.volume_id, secrets=secrets)
    assert keys_of(s3_server, bucket) == []
    log = driver.log()
    assert "CreateVolume" in log and "DeleteVolume" in log
    for value in secrets.values():
        assert value not in log


def test_stats_of_a_provisioned_volume_are_its_node_cache(all_mode, s3_server, bucket):
    """kubelet's volume metrics for a claim: capacity is the volume's disk cache (diskCache,
    not the claim's requested size), used is what that cache holds plus what pods wrote and
    is not uploaded yet; INODES count cache entries against diskCacheFiles."""
    _, kubelet = all_mode
    parameters = {"bucket": f"s3://{bucket}/pvcs", "endpointUrl": s3_server.endpoint,
                  "region": "us-east-1", "diskCache": "256Mi", "diskCacheFiles": "1000",
                  "blockSize": "1Mi"}
    volume = create(kubelet, "pvc-stats", parameters, required_bytes=2**40)
    context = dict(volume.volume_context)
    staging = kubelet.stage(volume.volume_id, context, secrets=SECRETS)
    target = kubelet.target_path("trainer", "pvc-stats")
    kubelet.publish(volume.volume_id, target, context)

    def usage(path: Path) -> dict[int, csi_pb2.VolumeUsage]:
        stats = kubelet.stats(volume.volume_id, path)
        assert not stats.volume_condition.abnormal
        return {item.unit: item for item in stats.usage}

    BYTES, INODES = csi_pb2.VolumeUsage.BYTES, csi_pb2.VolumeUsage.INODES
    empty = usage(target)
    assert (empty[BYTES].total, empty[BYTES].used, empty[BYTES].available) == (256 * 2**20, 0,
                                                                                 256 * 2**20)
    assert (empty[INODES].total, empty[INODES].used) == (1000, 0)

    (target / "checkpoint.bin").write_bytes(b"c" * 3 * 2**20)
    for path in (target, staging):
        written = usage(path)
        assert written[BYTES].total == 256 * 2**20
        assert written[BYTES].used >= 3 * 2**20
        assert written[BYTES].available == written[BYTES].total - written[BYTES].used
    kubelet.unpublish(volume.volume_id, target)
    kubelet.unstage(volume.volume_id)
    assert "pvcs/pvc-stats/checkpoint.bin" in keys_of(s3_server, bucket)
