"""The CSI v1 message classes and gRPC stubs, generated from `csi.proto` and checked in.

Checked in, not compiled at import: grpcio-tools' protoc bundles its own abseil, and loading it
into a process that already holds TensorFlow's or torch's aborts the interpreter ("Mutex
corrupt"), which a training node's tooling may well do. The generated code needs protobuf >= 7.35
and grpcio >= 1.85.1 (the `k8s` extra pins both). Regenerate after editing `csi.proto` with

    python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. csi_driver/csi.proto

and `tests/csi/test_proto.py` fails until the checked-in files match that output.
"""

from csi_driver import csi_pb2, csi_pb2_grpc

__all__ = ["csi_pb2", "csi_pb2_grpc"]
