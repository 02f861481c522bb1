"""Which volume capabilities avafs can serve, for the Node and Controller services alike.

An avafs volume is a FUSE filesystem: never a block device, and avafs options are volume
attributes, not mount flags. The controller also promises access modes at provisioning time,
so it says which of them hold: many readers and writers on many nodes (the bucket is shared,
and a file written on one node is seen by the others once uploaded) and one writer node. It
cannot promise "one writer among many nodes" or "one pod", so it refuses those modes.
"""

from __future__ import annotations

from .proto import csi_pb2

AccessMode = csi_pb2.VolumeCapability.AccessMode
READ_ONLY_MODES = {AccessMode.SINGLE_NODE_READER_ONLY, AccessMode.MULTI_NODE_READER_ONLY}
PROVISIONED_MODES = {AccessMode.SINGLE_NODE_WRITER, AccessMode.SINGLE_NODE_READER_ONLY,
                     AccessMode.MULTI_NODE_READER_ONLY, AccessMode.MULTI_NODE_MULTI_WRITER}


def mount_problem(capability: csi_pb2.VolumeCapability, field: str) -> str | None:
    """Why the node cannot mount a volume with this capability, or None."""
    if capability.access_mode.mode == AccessMode.UNKNOWN:
        return f"{field}.access_mode is required"
    access_type = capability.WhichOneof("access_type")
    if access_type == "block":
        return (f"{field}.block is not supported: an avafs volume is a filesystem "
                "(use volumeMode: Filesystem)")
    if access_type is None:
        return f"{field}.mount is required"
    if capability.mount.mount_flags:
        return (f"{field}.mount.mount_flags (PersistentVolume mountOptions) are not "
                "supported: set avafs options in volumeAttributes")
    return None


def provisioning_problem(capability: csi_pb2.VolumeCapability, field: str) -> str | None:
    """Why a provisioned volume cannot promise this capability, or None."""
    problem = mount_problem(capability, field)
    if problem is None and capability.access_mode.mode not in PROVISIONED_MODES:
        supported = ", ".join(sorted(AccessMode.Mode.Name(mode) for mode in PROVISIONED_MODES))
        return (f"{field}.access_mode {AccessMode.Mode.Name(capability.access_mode.mode)} is "
                f"not supported; supported: {supported}")
    return problem
