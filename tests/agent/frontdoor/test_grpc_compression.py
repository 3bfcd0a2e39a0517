"""Compressed gRPC requests (tritonclient's `compression_algorithm`, grpcurl's and
grpc's `-C gzip`) on both doors, capped after decompression."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg

from edgeplex.agent.catalog import demo
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import start_agent

# A 1 MiB payload cap: an inference message may decompress to 2 x 1 MiB + 1 MiB.
PAYLOAD_CAP = 1 << 20


@pytest.fixture(scope="module", params=["native", "grpcio"])
def agent(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"compression-{request.param}")
    demo.make_mlp(tmp / "repo" / "mlp", width=16, layers=1)
    env = {
        "EDGEPLEX_AGENT_GRPC_SERVER": request.param,
        "EDGEPLEX_AGENT_MAX_PAYLOAD_BYTES": str(PAYLOAD_CAP),
    }
    agent = start_agent(tmp / "repo", tmp, env=env)
    yield agent
    assert agent.stop() == 0, agent.log()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_request_is_served(agent, algorithm: str) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [tg.InferInput("input", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(x)
    plain = client.infer("mlp", inputs).as_numpy("output")
    packed = client.infer("mlp", inputs, compression_algorithm=algorithm).as_numpy("output")
    np.testing.assert_array_equal(plain, packed)


def test_a_message_that_decompresses_past_the_cap_is_refused(agent) -> None:
    """8 MiB of zeros compress to a few KiB: refused once decompression passes the
    cap, and the next call is served."""
    zeros = np.zeros((1, 2 << 20), dtype=np.float32)
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="input", datatype="FP32", shape=list(zeros.shape))
    request.raw_input_contents.append(zeros.tobytes())
    with grpc.insecure_channel(agent.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=30, compression=grpc.Compression.Gzip)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        small = pb.ModelInferRequest(model_name="mlp")
        small.inputs.add(name="input", datatype="FP32", shape=[1, 16])
        small.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
        reply = stub.ModelInfer(small, timeout=30, compression=grpc.Compression.Gzip)
        assert reply.model_name == "mlp"
