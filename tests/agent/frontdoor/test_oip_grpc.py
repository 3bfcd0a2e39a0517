"""The agent over gRPC, driven by the stock tritonclient, against direct ORT:
every test runs against both gRPC doors (native nghttp2, and grpcio's server)."""

from __future__ import annotations

import contextlib
import queue
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import AUTH, running_agent
from tests.support.oip import DTYPES, direct, inputs_for, silero_feeds


@pytest.fixture(scope="module", params=["native", "grpcio"])
def agent(request, model_repo, tmp_path_factory):
    with running_agent(model_repo, tmp_path_factory, EDGEPLEX_AGENT_GRPC_SERVER=request.param) as a:
        yield a


@pytest.fixture(scope="module")
def client(agent):
    return tg.InferenceServerClient(agent.grpc_url)


def test_server_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "edgeplex"
    assert {"model_repository", "classification", "sequence"} <= set(meta.extensions)


def test_model_metadata_comes_from_the_onnx_graph(client):
    meta = client.get_model_metadata("silero_vad")
    inputs = {t.name: (t.datatype, list(t.shape)) for t in meta.inputs}
    assert inputs == {
        "input": ("FP32", [-1, -1]),
        "state": ("FP32", [2, -1, 128]),
        "sr": ("INT64", []),
    }
    meta = client.get_model_metadata("add_sub")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUTPUT0", "FP32", [-1, 16]),
        ("OUTPUT1", "FP32", [-1, 16]),
    ]
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("add_sub", "7")
    config = client.get_model_config("add_sub").config
    assert config.max_batch_size == 16 and list(config.input[0].dims) == [16]


def test_infer_matches_direct_onnxruntime_exactly(client, model_repo):
    rng = np.random.default_rng(0)
    feeds = {
        "INPUT0": rng.standard_normal((3, 16), dtype=np.float32),
        "INPUT1": rng.standard_normal((3, 16), dtype=np.float32),
    }
    result = client.infer("add_sub_nobatch", inputs_for(feeds))
    expected = direct(model_repo, "add_sub_nobatch", feeds)
    for name, value in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), value)


def test_real_packaged_model_matches_direct_onnxruntime(client, model_repo):
    feeds = silero_feeds()
    result = client.infer("silero_vad", inputs_for(feeds))
    expected = direct(model_repo, "silero_vad", feeds)
    np.testing.assert_array_equal(result.as_numpy("output"), expected["output"])
    np.testing.assert_array_equal(result.as_numpy("stateN"), expected["stateN"])


@pytest.mark.parametrize("datatype", list(DTYPES))
def test_every_datatype_round_trips(client, datatype):
    rng = np.random.default_rng(2)
    dtype = DTYPES[datatype]
    if dtype is np.bool_:
        array = rng.integers(0, 2, (2, 8)).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, (2, 8), dtype=dtype, endpoint=True)
    else:
        array = rng.standard_normal((2, 8)).astype(dtype)
    result = client.infer(f"identity_{datatype.lower()}", inputs_for({"INPUT": array}))
    out = result.as_numpy("OUTPUT")
    assert out.dtype == array.dtype
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize(
    "datatype,field",
    [
        ("FP32", "fp32_contents"),
        ("INT64", "int64_contents"),
        ("INT32", "int_contents"),
        ("INT8", "int_contents"),
        ("UINT8", "uint_contents"),
        ("BOOL", "bool_contents"),
    ],
)
def test_typed_contents_are_accepted(agent, datatype, field):
    values = [1, 0, 1, 1, 0, 0, 1, 0] if datatype == "BOOL" else [1, 2, 3, 4, 5, 6, 7, 8]
    request = pb.ModelInferRequest(model_name=f"identity_{datatype.lower()}")
    tensor = request.inputs.add(name="INPUT", datatype=datatype, shape=[1, 8])
    getattr(tensor.contents, field).extend(values)
    with grpc.insecure_channel(agent.grpc_url) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    out = np.frombuffer(response.raw_output_contents[0], dtype=DTYPES[datatype])
    np.testing.assert_array_equal(out, np.array(values, dtype=DTYPES[datatype]))
    assert list(response.outputs[0].shape) == [1, 8]


def test_concurrent_requests_are_batched_and_match_within_tolerance(client, model_repo):
    rng = np.random.default_rng(3)
    requests = [
        {
            "INPUT0": rng.standard_normal((1 + i % 3, 16), dtype=np.float32),
            "INPUT1": rng.standard_normal((1 + i % 3, 16), dtype=np.float32),
        }
        for i in range(24)
    ]
    before = client.get_inference_statistics("add_sub").model_stats[0]

    def call(feeds):
        return client.infer("add_sub", inputs_for(feeds))

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, requests))
    for feeds, result in zip(requests, results, strict=True):
        expected = direct(model_repo, "add_sub", feeds)
        for name, value in expected.items():
            np.testing.assert_allclose(result.as_numpy(name), value, atol=1e-5, rtol=1e-5)
    after = client.get_inference_statistics("add_sub").model_stats[0]
    executions = after.execution_count - before.execution_count
    inferences = after.inference_count - before.inference_count
    assert inferences == sum(f["INPUT0"].shape[0] for f in requests)
    assert executions < len(requests), "no two requests shared a batch"
    assert any(b.batch_size > 1 for b in after.batch_stats)


def test_statistics_and_repository_index(client):
    stats = client.get_inference_statistics("mlp_small").model_stats
    assert stats[0].name == "mlp_small"
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["add_sub"].state == "READY"
    assert index["broken"].state == "FAILED"


def test_unload_then_load(client):
    client.unload_model("mlp_small", headers=AUTH)
    assert not client.is_model_ready("mlp_small")
    feeds = {"input": np.ones((1, 32), dtype=np.float32)}
    with pytest.raises(InferenceServerException) as err:
        client.infer("mlp_small", inputs_for(feeds))
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    client.load_model("mlp_small", headers=AUTH)
    assert client.is_model_ready("mlp_small")
    assert client.infer("mlp_small", inputs_for(feeds)).as_numpy("output").shape == (1, 64)


def test_a_stream_answers_each_request_in_order_and_errors_in_band(agent):
    results: queue.Queue = queue.Queue()
    client = tg.InferenceServerClient(agent.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(6):
            x = np.full((1, 16), i, np.float32)
            model = "no_such_model" if i == 3 else "add_sub"
            client.async_stream_infer(model, inputs_for({"INPUT0": x, "INPUT1": x}),
                                      request_id=str(i))  # fmt: skip
        got = [results.get(timeout=20) for _ in range(6)]
    finally:
        client.stop_stream()
    for i, (result, error) in enumerate(got):
        if i == 3:
            assert result is None and "no_such_model" in str(error)
            continue
        assert error is None, error
        assert result.get_response().id == str(i)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2 * i))


def test_what_the_door_does_not_speak_is_named(agent):
    with grpc.insecure_channel(agent.grpc_url) as channel:
        nope = channel.unary_unary("/inference.GRPCInferenceService/Nope")
        with pytest.raises(grpc.RpcError) as err:
            nope(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(agent.grpc_url, compression=grpc.Compression.Gzip) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # both doors decompress
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live


def test_a_cancelled_call_leaves_the_door_serving(agent):
    with grpc.insecure_channel(agent.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="slow")
        request.inputs.add(name="input", datatype="FP32", shape=[1, 512, 512])
        request.raw_input_contents.append(np.full((1, 512, 512), 1e-3, np.float32).tobytes())
        auth = tuple(AUTH.items())
        calls = [stub.ModelInfer.future(request, metadata=auth, timeout=30) for _ in range(4)]
        for call in calls:
            # Not asserted: a call the door refused meanwhile (the model's queue holds
            # 2) has ended already, and a cancel then does nothing.
            call.cancel()
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
        reply = stub.ModelInfer(request, metadata=auth, timeout=30)
        assert reply.model_name == "slow"


def test_garbage_on_the_grpc_port_ends_only_that_connection(agent, client):
    host, port = agent.grpc_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 16)
        with contextlib.suppress(OSError):  # reset, or closed after a GOAWAY
            while conn.recv(4096):
                pass
    assert client.is_server_live()
    x = np.ones((1, 16), np.float32)
    result = client.infer("add_sub", inputs_for({"INPUT0": x, "INPUT1": x}))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x)


def test_a_message_that_does_not_parse_is_invalid_argument(agent, client):
    with grpc.insecure_channel(agent.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for junk in (b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 7, b"\x12\x05ab"):
            with pytest.raises(grpc.RpcError) as failure:
                call(junk, metadata=tuple(AUTH.items()), timeout=5)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, junk
            assert "does not parse" in failure.value.details()
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as failure:
            list(stream(iter([b"\xff" * 7]), metadata=tuple(AUTH.items()), timeout=5))
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.is_server_live()
