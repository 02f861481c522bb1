"""The Node service: checks each request as the CSI specification says, then hands it on.

Checks run in the order csi-sanity and the specification's error tables expect: missing
required fields first (INVALID_ARGUMENT, naming the field), then what the fields say
(unknown volume: NOT_FOUND; conflicting re-stage or re-publish: ALREADY_EXISTS).
"""

from __future__ import annotations

import os

from .capabilities import READ_ONLY_MODES, mount_problem
from .errors import failed_precondition, invalid_argument, required
from .mounts import normalize
from .proto import csi_pb2, csi_pb2_grpc
from .rpc import csi_method
from .volume_spec import (
    POD_INFO_PREFIX,
    VolumeSpec,
    parse_credentials,
    parse_volume_context,
    with_mount_group,
)
from .volumes import VolumeManager

EPHEMERAL = POD_INFO_PREFIX + "ephemeral"
"""Set to "true" by kubelet for an inline volume (`csi:` in a pod spec); the CSIDriver must
list Ephemeral in volumeLifecycleModes."""

NODE_CAPABILITIES = (
    csi_pb2.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME,
    csi_pb2.NodeServiceCapability.RPC.GET_VOLUME_STATS,
    csi_pb2.NodeServiceCapability.RPC.VOLUME_CONDITION,
    csi_pb2.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP,
)


def _absolute_path(value: str, field: str) -> str:
    required(value, field)
    if not os.path.isabs(value):
        raise invalid_argument(f"{field} must be an absolute path, got {value!r}")
    return normalize(value)


def _check_capability(request) -> bool:
    """Whether the capability asks for a read-only volume; refuses what avafs cannot serve."""
    if not request.HasField("volume_capability"):
        raise invalid_argument("volume_capability is required")
    problem = mount_problem(request.volume_capability, "volume_capability")
    if problem is not None:
        raise invalid_argument(problem)
    return request.volume_capability.access_mode.mode in READ_ONLY_MODES


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, volumes: VolumeManager, node_id: str, max_volumes_per_node: int,
                 allow_file_sources: bool) -> None:
        self._volumes = volumes
        self._node_id = node_id
        self._max_volumes_per_node = max_volumes_per_node
        self._allow_file_sources = allow_file_sources

    @csi_method
    def NodeStageVolume(self, request: csi_pb2.NodeStageVolumeRequest
                        ) -> csi_pb2.NodeStageVolumeResponse:
        volume_id = required(request.volume_id, "volume_id")
        staging_path = _absolute_path(request.staging_target_path, "staging_target_path")
        spec = self._spec(request, _check_capability(request))
        credentials = parse_credentials(request.secrets)
        self._volumes.stage(volume_id, staging_path, spec, credentials)
        return csi_pb2.NodeStageVolumeResponse()

    def _spec(self, request, read_only: bool) -> VolumeSpec:
        """The volume a stage (or an inline publish) asks for, refused if it is not allowed."""
        spec, _ = parse_volume_context(request.volume_context, read_only)
        spec = with_mount_group(spec, request.volume_capability.mount.volume_mount_group)
        if not self._allow_file_sources and any(url.startswith("file:") for url in spec.urls()):
            raise invalid_argument("file:// sources are disabled on this node (they would serve "
                                   "the plugin's own filesystem); start the plugin with "
                                   "--allow-file-sources to enable them")
        return spec

    @csi_method
    def NodeUnstageVolume(self, request: csi_pb2.NodeUnstageVolumeRequest
                          ) -> csi_pb2.NodeUnstageVolumeResponse:
        volume_id = required(request.volume_id, "volume_id")
        staging_path = _absolute_path(request.staging_target_path, "staging_target_path")
        self._volumes.unstage(volume_id, staging_path)
        return csi_pb2.NodeUnstageVolumeResponse()

    @csi_method
    def NodePublishVolume(self, request: csi_pb2.NodePublishVolumeRequest
                          ) -> csi_pb2.NodePublishVolumeResponse:
        volume_id = required(request.volume_id, "volume_id")
        target_path = _absolute_path(request.target_path, "target_path")
        read_only = _check_capability(request)
        if request.volume_context.get(EPHEMERAL) == "true":
            staging_path = self._volumes.stage_ephemeral(
                volume_id, self._spec(request, read_only or request.readonly),
                parse_credentials(request.secrets))
        elif not request.staging_target_path:
            raise failed_precondition("staging_target_path is required: this plugin has the "
                                      "STAGE_UNSTAGE_VOLUME capability")
        else:
            staging_path = _absolute_path(request.staging_target_path, "staging_target_path")
        sub_path = request.volume_context.get("subPath", "")
        self._volumes.publish(volume_id, staging_path, target_path, sub_path,
                              request.volume_context, request.readonly,
                              request.volume_capability.mount.volume_mount_group)
        return csi_pb2.NodePublishVolumeResponse()

    @csi_method
    def NodeUnpublishVolume(self, request: csi_pb2.NodeUnpublishVolumeRequest
                            ) -> csi_pb2.NodeUnpublishVolumeResponse:
        volume_id = required(request.volume_id, "volume_id")
        target_path = _absolute_path(request.target_path, "target_path")
        self._volumes.unpublish(volume_id, target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    @csi_method
    def NodeGetVolumeStats(self, request: csi_pb2.NodeGetVolumeStatsRequest
                           ) -> csi_pb2.NodeGetVolumeStatsResponse:
        volume_id = required(request.volume_id, "volume_id")
        volume_path = required(request.volume_path, "volume_path")
        stats = self._volumes.stats(volume_id, volume_path)
        return csi_pb2.NodeGetVolumeStatsResponse(
            usage=[csi_pb2.VolumeUsage(unit=csi_pb2.VolumeUsage.Unit.Value(usage.unit),
                                       total=usage.total, available=usage.available,
                                       used=usage.used)
                   for usage in stats.usage],
            volume_condition=csi_pb2.VolumeCondition(abnormal=stats.abnormal,
                                                     message=stats.message))

    @csi_method
    def NodeGetCapabilities(self, request: csi_pb2.NodeGetCapabilitiesRequest
                            ) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[
            csi_pb2.NodeServiceCapability(rpc=csi_pb2.NodeServiceCapability.RPC(type=kind))
            for kind in NODE_CAPABILITIES])

    @csi_method
    def NodeGetInfo(self, request: csi_pb2.NodeGetInfoRequest) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self._node_id,
                                           max_volumes_per_node=self._max_volumes_per_node)
