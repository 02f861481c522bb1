"""The Identity service: who the plugin is and whether it is ready.

CONTROLLER_SERVICE is advertised only by a plugin that serves the Controller service
(`--mode controller` or `all`): the external-provisioner refuses to start against a plugin
without it, and a node-only plugin must not invite Controller calls. Probe answers ready
only after the first reconciliation, so the CO can tell "still
re-mounting after a restart" from "healthy".
"""

from __future__ import annotations

import threading

from avafs import __version__

from .proto import csi_pb2, csi_pb2_grpc
from .rpc import csi_method


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def __init__(self, driver_name: str, ready: threading.Event, controller: bool) -> None:
        self._driver_name = driver_name
        self._ready = ready
        self._controller = controller

    @csi_method
    def GetPluginInfo(self, request: csi_pb2.GetPluginInfoRequest) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=self._driver_name, vendor_version=__version__)

    @csi_method
    def GetPluginCapabilities(self, request: csi_pb2.GetPluginCapabilitiesRequest
                              ) -> csi_pb2.GetPluginCapabilitiesResponse:
        if not self._controller:
            return csi_pb2.GetPluginCapabilitiesResponse()
        Service = csi_pb2.PluginCapability.Service
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=[
            csi_pb2.PluginCapability(service=Service(type=Service.CONTROLLER_SERVICE))])

    @csi_method
    def Probe(self, request: csi_pb2.ProbeRequest) -> csi_pb2.ProbeResponse:
        response = csi_pb2.ProbeResponse()
        response.ready.value = self._ready.is_set()
        return response
