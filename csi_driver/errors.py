"""The exception an RPC raises to answer with a given gRPC status.

CSI gives each failure a status code with a meaning the CO acts on (retry, give up, fix the
request), so the code is chosen where the failure is understood, not at the edge.
"""

import grpc


class CsiError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid_argument(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.NOT_FOUND, message)


def already_exists(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.ALREADY_EXISTS, message)


def failed_precondition(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.FAILED_PRECONDITION, message)


def internal(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INTERNAL, message)


def required(value: str, field: str) -> str:
    """`value`, or INVALID_ARGUMENT naming the missing field (csi-sanity expects that code)."""
    if not value:
        raise invalid_argument(f"{field} is required")
    return value
