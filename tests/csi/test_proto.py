"""The plugin's `csi.proto` against the CSI v1 specification: names, numbers, enum values.

A CO encodes requests with the specification's field numbers; a wrong number here would not
fail to compile, it would silently drop a field (a secret, the readonly flag) on the wire.
The table below is typed from the specification's csi.proto, not from this repository's.
"""

from __future__ import annotations

from csi_driver.proto import csi_pb2

SPEC_FIELDS = {
    "GetPluginInfoResponse": {"name": 1, "vendor_version": 2, "manifest": 3},
    "GetPluginCapabilitiesResponse": {"capabilities": 1},
    "PluginCapability": {"service": 1, "volume_expansion": 2},
    "PluginCapability.Service": {"type": 1},
    "PluginCapability.VolumeExpansion": {"type": 1},
    "ProbeResponse": {"ready": 1},
    "VolumeCapability": {"block": 1, "mount": 2, "access_mode": 3},
    "VolumeCapability.MountVolume": {"fs_type": 1, "mount_flags": 2, "volume_mount_group": 3},
    "VolumeCapability.AccessMode": {"mode": 1},
    "Topology": {"segments": 1},
    "NodeStageVolumeRequest": {"volume_id": 1, "publish_context": 2, "staging_target_path": 3,
                               "volume_capability": 4, "secrets": 5, "volume_context": 6},
    "NodeUnstageVolumeRequest": {"volume_id": 1, "staging_target_path": 2},
    "NodePublishVolumeRequest": {"volume_id": 1, "publish_context": 2, "staging_target_path": 3,
                                 "target_path": 4, "volume_capability": 5, "readonly": 6,
                                 "secrets": 7, "volume_context": 8},
    "NodeUnpublishVolumeRequest": {"volume_id": 1, "target_path": 2},
    "NodeGetVolumeStatsRequest": {"volume_id": 1, "volume_path": 2, "staging_target_path": 3},
    "NodeGetVolumeStatsResponse": {"usage": 1, "volume_condition": 2},
    "VolumeUsage": {"available": 1, "total": 2, "used": 3, "unit": 4},
    "VolumeCondition": {"abnormal": 1, "message": 2},
    "NodeGetCapabilitiesResponse": {"capabilities": 1},
    "NodeServiceCapability": {"rpc": 1},
    "NodeServiceCapability.RPC": {"type": 1},
    "NodeGetInfoResponse": {"node_id": 1, "max_volumes_per_node": 2, "accessible_topology": 3},
    # The Controller messages, without the alpha and topology fields left out on purpose.
    "CreateVolumeRequest": {"name": 1, "capacity_range": 2, "volume_capabilities": 3,
                            "parameters": 4, "secrets": 5, "volume_content_source": 6},
    "VolumeContentSource": {"snapshot": 1, "volume": 2},
    "VolumeContentSource.SnapshotSource": {"snapshot_id": 1},
    "VolumeContentSource.VolumeSource": {"volume_id": 1},
    "CreateVolumeResponse": {"volume": 1},
    "CapacityRange": {"required_bytes": 1, "limit_bytes": 2},
    "Volume": {"capacity_bytes": 1, "volume_id": 2, "volume_context": 3, "content_source": 4},
    "DeleteVolumeRequest": {"volume_id": 1, "secrets": 2},
    "ValidateVolumeCapabilitiesRequest": {"volume_id": 1, "volume_context": 2,
                                          "volume_capabilities": 3, "parameters": 4,
                                          "secrets": 5},
    "ValidateVolumeCapabilitiesResponse": {"confirmed": 1, "message": 2},
    "ValidateVolumeCapabilitiesResponse.Confirmed": {"volume_context": 1,
                                                     "volume_capabilities": 2,
                                                     "parameters": 3},
    "ControllerGetCapabilitiesResponse": {"capabilities": 1},
    "ControllerServiceCapability": {"rpc": 1},
    "ControllerServiceCapability.RPC": {"type": 1},
}
EMPTY_MESSAGES = ["GetPluginInfoRequest", "GetPluginCapabilitiesRequest", "ProbeRequest",
                  "VolumeCapability.BlockVolume", "NodeStageVolumeResponse",
                  "NodeUnstageVolumeResponse", "NodePublishVolumeResponse",
                  "NodeUnpublishVolumeResponse", "NodeGetCapabilitiesRequest",
                  "NodeGetInfoRequest", "DeleteVolumeResponse",
                  "ControllerGetCapabilitiesRequest"]
SPEC_ENUMS = {
    "PluginCapability.Service.Type": {"UNKNOWN": 0, "CONTROLLER_SERVICE": 1,
                                      "VOLUME_ACCESSIBILITY_CONSTRAINTS": 2,
                                      "GROUP_CONTROLLER_SERVICE": 3,
                                      "SNAPSHOT_METADATA_SERVICE": 4},
    "PluginCapability.VolumeExpansion.Type": {"UNKNOWN": 0, "ONLINE": 1, "OFFLINE": 2},
    "VolumeCapability.AccessMode.Mode": {"UNKNOWN": 0, "SINGLE_NODE_WRITER": 1,
                                         "SINGLE_NODE_READER_ONLY": 2,
                                         "MULTI_NODE_READER_ONLY": 3,
                                         "MULTI_NODE_SINGLE_WRITER": 4,
                                         "MULTI_NODE_MULTI_WRITER": 5,
                                         "SINGLE_NODE_SINGLE_WRITER": 6,
                                         "SINGLE_NODE_MULTI_WRITER": 7},
    "VolumeUsage.Unit": {"UNKNOWN": 0, "BYTES": 1, "INODES": 2},
    "NodeServiceCapability.RPC.Type": {"UNKNOWN": 0, "STAGE_UNSTAGE_VOLUME": 1,
                                       "GET_VOLUME_STATS": 2, "EXPAND_VOLUME": 3,
                                       "VOLUME_CONDITION": 4, "SINGLE_NODE_MULTI_WRITER": 5,
                                       "VOLUME_MOUNT_GROUP": 6},
    "ControllerServiceCapability.RPC.Type": {
        "UNKNOWN": 0, "CREATE_DELETE_VOLUME": 1, "PUBLISH_UNPUBLISH_VOLUME": 2,
        "LIST_VOLUMES": 3, "GET_CAPACITY": 4, "CREATE_DELETE_SNAPSHOT": 5, "LIST_SNAPSHOTS": 6,
        "CLONE_VOLUME": 7, "PUBLISH_READONLY": 8, "EXPAND_VOLUME": 9,
        "LIST_VOLUMES_PUBLISHED_NODES": 10, "VOLUME_CONDITION": 11, "GET_VOLUME": 12,
        "SINGLE_NODE_MULTI_WRITER": 13, "MODIFY_VOLUME": 14},
}
SPEC_METHODS = {
    "Identity": ["GetPluginInfo", "GetPluginCapabilities", "Probe"],
    # The specification's order, without the RPCs left out on purpose.
    "Controller": ["CreateVolume", "DeleteVolume", "ValidateVolumeCapabilities",
                   "ControllerGetCapabilities"],
    "Node": ["NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume",
             "NodeGetVolumeStats", "NodeGetCapabilities", "NodeGetInfo"],
}


def _message(dotted: str):
    descriptor = csi_pb2.DESCRIPTOR.message_types_by_name[dotted.split(".")[0]]
    for part in dotted.split(".")[1:]:
        descriptor = descriptor.nested_types_by_name[part]
    return descriptor


def test_messages_have_the_specifications_field_names_and_numbers():
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    for name, fields in SPEC_FIELDS.items():
        found = {field.name: field.number for field in _message(name).fields}
        assert found == fields, name
    for name in EMPTY_MESSAGES:
        assert not _message(name).fields, name


def test_enums_have_the_specifications_values():
    for dotted, values in SPEC_ENUMS.items():
        *message, enum = dotted.split(".")
        descriptor = _message(".".join(message)).enum_types_by_name[enum]
        assert {value.name: value.number for value in descriptor.values} == values, dotted


def test_services_have_the_specifications_methods_and_types():
    for service, methods in SPEC_METHODS.items():
        descriptor = csi_pb2.DESCRIPTOR.services_by_name[service]
        assert descriptor.full_name == f"csi.v1.{service}"
        assert [method.name for method in descriptor.methods] == methods
        for method in descriptor.methods:
            assert method.input_type.name == f"{method.name}Request"
            assert method.output_type.name == f"{method.name}Response"


def test_secrets_fields_are_marked_csi_secret_with_the_specifications_extension_number():
    assert csi_pb2.csi_secret.number == 1059
    marked = {(message.name, field.name)
              for message in csi_pb2.DESCRIPTOR.message_types_by_name.values()
              for field in message.fields
              if field.GetOptions().Extensions[csi_pb2.csi_secret]}
    assert marked == {("NodeStageVolumeRequest", "secrets"),
                      ("NodePublishVolumeRequest", "secrets"), ("CreateVolumeRequest", "secrets"),
                      ("DeleteVolumeRequest", "secrets"),
                      ("ValidateVolumeCapabilitiesRequest", "secrets")}


def test_readonly_and_secrets_travel_under_the_specifications_tags():
    """Bytes a Go CO would send: field 6 (readonly) varint 1, field 7 (secrets) a map entry."""
    wire = bytes([6 << 3 | 0, 1]) + bytes([7 << 3 | 2, 8, 10, 1]) + b"k" + bytes([18, 3]) + b"val"
    request = csi_pb2.NodePublishVolumeRequest.FromString(wire)
    assert request.readonly is True and dict(request.secrets) == {"k": "val"}


def test_checked_in_stubs_match_the_proto(tmp_path):
    """The generated files are what protoc makes of csi.proto today (run in a subprocess:
    grpc_tools must not share a process with TensorFlow or torch)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "csi_driver").mkdir()
    (tmp_path / "csi_driver" / "csi.proto").write_bytes((repo / "csi_driver/csi.proto").read_bytes())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.",
                    "--grpc_python_out=.", "csi_driver/csi.proto"], cwd=tmp_path, check=True)
    for name in ("csi_pb2.py", "csi_pb2_grpc.py"):
        assert (tmp_path / "csi_driver" / name).read_text() == \
            (repo / "csi_driver" / name).read_text(), f"regenerate csi_driver/{name}"
