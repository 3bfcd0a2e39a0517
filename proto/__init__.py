"""Wire contracts of edgeplex: the `.proto` files of this folder and the code
generated from them (scripts/gen_proto.py; never edit the *_pb2* files)."""

from . import inference_pb2, inference_pb2_grpc

__all__ = ["inference_pb2", "inference_pb2_grpc"]
