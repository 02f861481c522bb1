"""The edge of every RPC: one log line per call without secrets, errors as gRPC statuses.

Fields the CSI specification marks `csi_secret` (the `secrets` maps) and mount flags, which
the specification says may be sensitive, are masked by walking the message's descriptor,
so a field added to the `.proto` later is masked by the same rule.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message

from .errors import CsiError
from .proto import csi_pb2

log = logging.getLogger(__name__)

MASK = "<redacted>"
QUIET_METHODS = {"Probe", "GetPluginInfo", "GetPluginCapabilities", "NodeGetCapabilities",
                 "NodeGetInfo", "NodeGetVolumeStats", "ControllerGetCapabilities"}
"""Called every few seconds by sidecars and kubelet: logged at DEBUG only."""

_Servicer = TypeVar("_Servicer")
_Request = TypeVar("_Request", bound=Message)
_Response = TypeVar("_Response", bound=Message)


def _is_sensitive(field) -> bool:
    return field.GetOptions().Extensions[csi_pb2.csi_secret] or field.name == "mount_flags"


def _mask(message: Message) -> None:
    for field, value in message.ListFields():
        if _is_sensitive(field):
            if isinstance(value, str):
                setattr(message, field.name, MASK)
            elif hasattr(value, "keys"):
                for key in list(value):
                    value[key] = MASK
            else:
                value[:] = [MASK] * len(value)
        elif isinstance(value, Message):
            _mask(value)
        elif field.message_type is not None and not hasattr(value, "keys"):
            for item in value:
                _mask(item)


def redacted(message: Message) -> str:
    """The message as one line of text, sensitive values replaced by a mask."""
    copy = type(message)()
    copy.CopyFrom(message)
    _mask(copy)
    return text_format.MessageToString(copy, as_one_line=True)


def csi_method(method: Callable[[_Servicer, _Request], _Response]
               ) -> Callable[[_Servicer, _Request, grpc.ServicerContext], _Response]:
    """Wrap `method(self, request)` as a gRPC handler `(self, request, context)`."""
    name = method.__name__

    @functools.wraps(method)
    def handler(self: _Servicer, request: _Request, context: grpc.ServicerContext) -> _Response:
        log.log(logging.DEBUG if name in QUIET_METHODS else logging.INFO, "%s %s", name,
                redacted(request))
        try:
            return method(self, request)
        except CsiError as error:
            log.warning("%s failed: %s: %s", name, error.code.name, error.message)
            context.abort(error.code, error.message)
        except Exception as error:
            log.exception("%s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{name}: {error}")
        raise AssertionError("context.abort returned")

    return handler
