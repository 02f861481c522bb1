"""The Controller service: a StorageClass's volumes as directories of its bucket.

CreateVolume makes `<bucket>/<name>/` and records what the name was created with;
DeleteVolume deletes the directory's objects (`reclaim: delete`) or keeps them (`retain`, the
default: an object store has no snapshots, and a deleted PVC should not take data with it
unless its StorageClass says so). Both are idempotent, as the external-provisioner retries
them after any failure. Nothing is attached (the CSIDriver says attachRequired: false), so
CREATE_DELETE_VOLUME is the only capability.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .buckets import Bucket, BucketError, open_bucket
from .capabilities import provisioning_problem
from .errors import already_exists, internal, invalid_argument, not_found, required
from .proto import csi_pb2, csi_pb2_grpc
from .provisioning import (
    RESERVED_PREFIX,
    StorageClassParameters,
    VolumeLocation,
    parse_parameters,
    read_record,
    record_body,
)
from .rpc import csi_method
from .volume_spec import parse_credentials

log = logging.getLogger(__name__)

CONTROLLER_CAPABILITIES = (csi_pb2.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME,)


def _capacity(request: csi_pb2.CreateVolumeRequest) -> int:
    """The size to report: what was asked for. A bucket prefix has no size of its own, so
    any request can be met; the figure is recorded for idempotency and shown by `kubectl`."""
    wanted = request.capacity_range
    if wanted.required_bytes < 0 or wanted.limit_bytes < 0:
        raise invalid_argument("capacity_range must not be negative")
    if wanted.limit_bytes and wanted.required_bytes > wanted.limit_bytes:
        raise invalid_argument(f"capacity_range.required_bytes {wanted.required_bytes} is more "
                               f"than limit_bytes {wanted.limit_bytes}")
    return wanted.required_bytes or wanted.limit_bytes


class ControllerService(csi_pb2_grpc.ControllerServicer):
    def __init__(self, allow_file_sources: bool) -> None:
        self._allow_file_sources = allow_file_sources
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def _locked(self, location: VolumeLocation) -> Iterator[None]:
        """One create or delete of a volume at a time within this controller (the
        external-provisioner runs one leader, and retries calls that time out)."""
        with self._guard:
            lock = self._locks.setdefault(location.url, threading.Lock())
        with lock:
            yield

    def _bucket(self, location: VolumeLocation, secrets) -> Bucket:
        if location.bucket_url.startswith("file:") and not self._allow_file_sources:
            raise invalid_argument("file:// buckets are disabled (they would serve the "
                                   "plugin's own filesystem); start the plugin with "
                                   "--allow-file-sources to enable them")
        return open_bucket(location.bucket_url, location.query.get("endpointUrl"),
                           location.query.get("region"), parse_credentials(secrets))

    @staticmethod
    def _record(bucket: Bucket, location: VolumeLocation) -> tuple[str, dict[str, str], int] | None:
        try:
            body = bucket.read(location.record_key)
        except BucketError as error:
            raise internal(str(error)) from None
        return None if body is None else read_record(body)

    @csi_method
    def CreateVolume(self, request: csi_pb2.CreateVolumeRequest) -> csi_pb2.CreateVolumeResponse:
        name = required(request.name, "name")
        if not request.volume_capabilities:
            raise invalid_argument("volume_capabilities is required")
        for index, capability in enumerate(request.volume_capabilities):
            problem = provisioning_problem(capability, f"volume_capabilities[{index}]")
            if problem is not None:
                raise invalid_argument(problem)
        if request.HasField("volume_content_source"):
            raise invalid_argument("volume_content_source is not supported: avafs volumes are "
                                   "not cloned or restored from snapshots")
        capacity = _capacity(request)
        parameters = parse_parameters(request.parameters)
        location = parameters.location(name)
        bucket = self._bucket(location, request.secrets)
        with self._locked(location):
            self._create(bucket, location, name, parameters, capacity)
        return csi_pb2.CreateVolumeResponse(volume=csi_pb2.Volume(
            capacity_bytes=capacity, volume_id=location.volume_id(),
            volume_context=parameters.volume_context(location)))

    def _create(self, bucket: Bucket, location: VolumeLocation, name: str,
                parameters: StorageClassParameters, capacity: int) -> None:
        existing = self._record(bucket, location)
        if existing is not None:
            if existing != (name, parameters.parameters(), capacity):
                raise already_exists(f"volume {name} already exists at {location.url} with "
                                     "other parameters or capacity")
            log.info("volume %s exists at %s", name, location.url)
            return
        try:
            bucket.write(location.prefix, b"")
            bucket.write(location.record_key,
                         record_body(name, parameters.parameters(), capacity))
        except BucketError as error:
            raise internal(str(error)) from None
        log.info("volume %s created at %s (reclaim: %s)", name, location.url, parameters.reclaim)

    @csi_method
    def DeleteVolume(self, request: csi_pb2.DeleteVolumeRequest) -> csi_pb2.DeleteVolumeResponse:
        volume_id = required(request.volume_id, "volume_id")
        location = VolumeLocation.from_volume_id(volume_id)
        if location is None:
            log.info("%s is not an id this driver makes: nothing to delete", volume_id)
            return csi_pb2.DeleteVolumeResponse()
        bucket = self._bucket(location, request.secrets)
        with self._locked(location):
            record = self._record(bucket, location)
            if record is None:
                log.info("volume %s is already deleted", location.url)
                return csi_pb2.DeleteVolumeResponse()
            reclaim = record[1]["reclaim"]
            try:
                if reclaim == "delete":
                    count = bucket.delete_prefix(location.prefix)
                    log.info("volume %s: deleted %d objects", location.url, count)
                bucket.delete(location.record_key)
            except BucketError as error:
                raise internal(str(error)) from None
        log.info("volume %s deleted (reclaim: %s)", location.url, reclaim)
        return csi_pb2.DeleteVolumeResponse()

    @csi_method
    def ValidateVolumeCapabilities(self, request: csi_pb2.ValidateVolumeCapabilitiesRequest
                                   ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        volume_id = required(request.volume_id, "volume_id")
        if not request.volume_capabilities:
            raise invalid_argument("volume_capabilities is required")
        location = VolumeLocation.from_volume_id(volume_id)
        record = None if location is None else self._record(
            self._bucket(location, request.secrets), location)
        if record is None:
            raise not_found(f"volume {volume_id} does not exist")
        Response = csi_pb2.ValidateVolumeCapabilitiesResponse
        for index, capability in enumerate(request.volume_capabilities):
            problem = provisioning_problem(capability, f"volume_capabilities[{index}]")
            if problem is not None:
                return Response(message=problem)
        asked = {key: value for key, value in request.parameters.items()
                 if not key.startswith(RESERVED_PREFIX)}
        if asked and parse_parameters(asked).parameters() != record[1]:
            return Response(message="the volume was created with other parameters")
        return Response(confirmed=Response.Confirmed(
            volume_context=request.volume_context,
            volume_capabilities=request.volume_capabilities, parameters=request.parameters))

    @csi_method
    def ControllerGetCapabilities(self, request: csi_pb2.ControllerGetCapabilitiesRequest
                                  ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        return csi_pb2.ControllerGetCapabilitiesResponse(capabilities=[
            csi_pb2.ControllerServiceCapability(
                rpc=csi_pb2.ControllerServiceCapability.RPC(type=kind))
            for kind in CONTROLLER_CAPABILITIES])
