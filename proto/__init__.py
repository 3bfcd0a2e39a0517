"""Wire contracts of edgeplex: the `.proto` files of this folder and the code
generated from them (scripts/gen_proto.py; never edit the *_pb2* files)."""

from . import edgeplex_agent_pb2, edgeplex_agent_pb2_grpc, inference_pb2, inference_pb2_grpc

__all__ = ["edgeplex_agent_pb2", "edgeplex_agent_pb2_grpc", "inference_pb2", "inference_pb2_grpc"]
