"""The csi-sanity cases that apply to a node-only plugin, plus this plugin's request checks.

Ported from kubernetes-csi/csi-test (pkg/sanity identity.go and node.go): the same requests,
the same expected status codes, against the real plugin process over its Unix socket. The
cases that need a mounted volume ("should remove target path", "volume does not exist on
the specified path", the full stage/publish cycle) live in test_lifecycle.py.
"""

from __future__ import annotations

import re

import grpc
import pytest

from avafs import __version__
from csi_driver.proto import csi_pb2

MODE = csi_pb2.VolumeCapability.AccessMode
RPC = csi_pb2.NodeServiceCapability.RPC
DOMAIN_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$")


def mount_capability(mode: int = MODE.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(),
                                    access_mode=MODE(mode=mode))


def call_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value


# --- Identity ------------------------------------------------------------------------------

def test_plugin_info_has_a_domain_name_and_the_avafs_version(shared_kubelet):
    info = shared_kubelet.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert 0 < len(info.name) <= 63 and DOMAIN_NAME.match(info.name) and "." in info.name
    assert info.vendor_version == __version__


def test_plugin_capabilities_are_known_and_name_no_controller(shared_kubelet):
    response = shared_kubelet.identity.GetPluginCapabilities(
        csi_pb2.GetPluginCapabilitiesRequest())
    known = set(csi_pb2.PluginCapability.Service.Type.values())
    for capability in response.capabilities:
        assert capability.WhichOneof("type") == "service"
        assert capability.service.type in known
    services = {capability.service.type for capability in response.capabilities}
    assert csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE not in services


def test_probe_answers_ready(shared_kubelet):
    response = shared_kubelet.identity.Probe(csi_pb2.ProbeRequest())
    assert response.HasField("ready") and response.ready.value


# --- Node: capabilities and info -----------------------------------------------------------

def test_node_capabilities(shared_kubelet):
    response = shared_kubelet.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    types = [capability.rpc.type for capability in response.capabilities]
    assert all(capability.WhichOneof("type") == "rpc" for capability in response.capabilities)
    assert set(types) <= set(RPC.Type.values())
    assert set(types) == {RPC.STAGE_UNSTAGE_VOLUME, RPC.GET_VOLUME_STATS, RPC.VOLUME_CONDITION,
                          RPC.VOLUME_MOUNT_GROUP}


def test_node_info(shared_kubelet):
    info = shared_kubelet.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id == "node-1"
    assert info.max_volumes_per_node == 16
    assert not info.HasField("accessible_topology")


# --- Node: missing and invalid fields ------------------------------------------------------

def _stage(**fields) -> tuple[str, object]:
    return "NodeStageVolume", csi_pb2.NodeStageVolumeRequest(**fields)


def _publish(**fields) -> tuple[str, object]:
    return "NodePublishVolume", csi_pb2.NodePublishVolumeRequest(**fields)


STAGING = "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.avafs.io/abc/globalmount"
TARGET = "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount"
BLOCK = csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(),
                                 access_mode=MODE(mode=MODE.SINGLE_NODE_WRITER))
NO_MODE = csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume())
NO_ACCESS_TYPE = csi_pb2.VolumeCapability(access_mode=MODE(mode=MODE.SINGLE_NODE_WRITER))
WITH_FLAGS = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(mount_flags=["password=hunter2"]),
    access_mode=MODE(mode=MODE.SINGLE_NODE_WRITER))

MISSING_OR_INVALID_FIELDS = {
    "stage without volume_id": (
        _stage(staging_target_path=STAGING, volume_capability=mount_capability()), "volume_id"),
    "stage without staging_target_path": (
        _stage(volume_id="v", volume_capability=mount_capability()), "staging_target_path"),
    "stage without volume_capability": (
        _stage(volume_id="v", staging_target_path=STAGING), "volume_capability"),
    "stage with a relative staging_target_path": (
        _stage(volume_id="v", staging_target_path="globalmount",
               volume_capability=mount_capability()), "staging_target_path"),
    "stage without access mode": (
        _stage(volume_id="v", staging_target_path=STAGING, volume_capability=NO_MODE),
        "volume_capability.access_mode"),
    "stage of a block volume": (
        _stage(volume_id="v", staging_target_path=STAGING, volume_capability=BLOCK),
        "volume_capability.block"),
    "stage without access type": (
        _stage(volume_id="v", staging_target_path=STAGING, volume_capability=NO_ACCESS_TYPE),
        "volume_capability.mount"),
    "stage with mount flags": (
        _stage(volume_id="v", staging_target_path=STAGING, volume_capability=WITH_FLAGS),
        "mount_flags"),
    "unstage without volume_id": (
        ("NodeUnstageVolume", csi_pb2.NodeUnstageVolumeRequest(staging_target_path=STAGING)),
        "volume_id"),
    "unstage without staging_target_path": (
        ("NodeUnstageVolume", csi_pb2.NodeUnstageVolumeRequest(volume_id="v")),
        "staging_target_path"),
    "publish without volume_id": (_publish(), "volume_id"),
    "publish without target_path": (_publish(volume_id="v"), "target_path"),
    "publish without volume_capability": (
        _publish(volume_id="v", target_path=TARGET), "volume_capability"),
    "publish of a block volume": (
        _publish(volume_id="v", target_path=TARGET, staging_target_path=STAGING,
                 volume_capability=BLOCK), "volume_capability.block"),
    "unpublish without volume_id": (
        ("NodeUnpublishVolume", csi_pb2.NodeUnpublishVolumeRequest(target_path=TARGET)),
        "volume_id"),
    "unpublish without target_path": (
        ("NodeUnpublishVolume", csi_pb2.NodeUnpublishVolumeRequest(volume_id="v")),
        "target_path"),
    "stats without volume_id": (
        ("NodeGetVolumeStats", csi_pb2.NodeGetVolumeStatsRequest(volume_path="some/path")),
        "volume_id"),
    "stats without volume_path": (
        ("NodeGetVolumeStats", csi_pb2.NodeGetVolumeStatsRequest(volume_id="v")),
        "volume_path"),
}


@pytest.mark.parametrize("case", MISSING_OR_INVALID_FIELDS, ids=list(MISSING_OR_INVALID_FIELDS))
def test_missing_or_invalid_field_is_invalid_argument_naming_it(shared_kubelet, case):
    (method, request), field = MISSING_OR_INVALID_FIELDS[case]
    error = call_error(getattr(shared_kubelet.node, method), request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert field in error.details()
    assert "hunter2" not in error.details()


def test_publish_without_staging_path_is_failed_precondition(shared_kubelet):
    error = call_error(shared_kubelet.node.NodePublishVolume, csi_pb2.NodePublishVolumeRequest(
        volume_id="v", target_path=TARGET, volume_capability=mount_capability()))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "staging_target_path" in error.details()


# --- Node: unknown volumes -----------------------------------------------------------------

def test_publish_of_a_volume_never_staged_is_not_found(shared_kubelet):
    target = shared_kubelet.target_path("pod", "never-staged")
    error = call_error(shared_kubelet.node.NodePublishVolume, csi_pb2.NodePublishVolumeRequest(
        volume_id="never-staged", staging_target_path=STAGING, target_path=str(target),
        volume_capability=mount_capability()))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "never-staged" in error.details()
    assert not target.exists()


def test_stats_of_an_unknown_volume_is_not_found(shared_kubelet):
    error = call_error(shared_kubelet.node.NodeGetVolumeStats, csi_pb2.NodeGetVolumeStatsRequest(
        volume_id="no-such-volume", volume_path="some/path"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_unstage_and_unpublish_of_unknown_volumes_succeed(shared_kubelet):
    target = shared_kubelet.target_path("pod", "gone")
    for _ in range(2):
        shared_kubelet.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id="gone", target_path=str(target)))
        shared_kubelet.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
            volume_id="gone", staging_target_path=STAGING))
    assert not target.exists()


# --- Node: volume attributes and secrets ---------------------------------------------------

INVALID_ATTRIBUTES = {
    "unknown key": ({"source": "s3://b", "ramcache": "1GiB"}, "'ramcache'"),
    "no source": ({"diskCache": "1GiB"}, "exactly one of 'source'"),
    "source and namespace": ({"source": "s3://b", "namespace": "{a: s3://c}"},
                             "exactly one of 'source'"),
    "unsupported source": ({"source": "http://example.com/b"}, "volumeAttributes.source"),
    "relative file source": ({"source": "file://data"}, "volumeAttributes.source"),
    "bad size": ({"source": "s3://b", "ramCache": "lots"}, "volumeAttributes.ramCache"),
    "bad switch": ({"source": "s3://b", "immutable": "yes"}, "volumeAttributes.immutable"),
    "bad ttl": ({"source": "s3://b", "metadataTtl": "-1"}, "volumeAttributes.metadataTtl"),
    "bad writeback": ({"source": "s3://b", "writeback": "never"}, "volumeAttributes.writeback"),
    "bad endpoint": ({"source": "s3://b", "endpointUrl": "minio:9000"},
                     "volumeAttributes.endpointUrl"),
    "namespace not a mapping": ({"namespace": "[s3://a, s3://b]"}, "volumeAttributes.namespace"),
    "namespace with a path": ({"namespace": "{a/b: s3://c}"}, "volumeAttributes.namespace"),
    "namespace not YAML": ({"namespace": "{a: [}"}, "volumeAttributes.namespace"),
    "subPath escaping the volume": ({"source": "s3://b", "subPath": "a/../../etc"},
                                    "volumeAttributes.subPath"),
    "absolute subPath": ({"source": "s3://b", "subPath": "/etc"}, "volumeAttributes.subPath"),
    "unknown subPath variable": ({"source": "s3://b", "subPath": "u/${pod.label}"},
                                 "${pod.label}"),
}


@pytest.mark.parametrize("case", INVALID_ATTRIBUTES, ids=list(INVALID_ATTRIBUTES))
def test_invalid_volume_attributes_are_invalid_argument_naming_them(shared_kubelet, case):
    attributes, named = INVALID_ATTRIBUTES[case]
    error = call_error(shared_kubelet.node.NodeStageVolume, csi_pb2.NodeStageVolumeRequest(
        volume_id="v", staging_target_path=str(shared_kubelet.staging_path("v")),
        volume_capability=mount_capability(), volume_context=attributes))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in error.details()


@pytest.mark.parametrize("secrets, named", [
    ({"accessKeyId": "AKIA-SHOWN-NOWHERE"}, "secretAccessKey"),
    ({"secretAccessKey": "SECRET-SHOWN-NOWHERE"}, "accessKeyId"),
    ({"accessKeyId": "AKIA-SHOWN-NOWHERE", "secretAccessKey": "SECRET-SHOWN-NOWHERE",
      "password": "SECRET-SHOWN-NOWHERE"}, "'password'"),
], ids=["key id alone", "secret alone", "unknown key"])
def test_invalid_secrets_are_invalid_argument_without_their_values(shared_kubelet, secrets,
                                                                    named):
    error = call_error(shared_kubelet.node.NodeStageVolume, csi_pb2.NodeStageVolumeRequest(
        volume_id="v", staging_target_path=str(shared_kubelet.staging_path("v")),
        volume_capability=mount_capability(), volume_context={"source": "s3://b"},
        secrets=secrets))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in error.details()
    assert "SHOWN-NOWHERE" not in error.details()
