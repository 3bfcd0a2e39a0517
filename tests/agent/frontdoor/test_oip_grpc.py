"""The agent over gRPC, driven by the stock tritonclient, against direct ORT."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import AUTH

DTYPES = {
    "FP32": np.float32,
    "FP16": np.float16,
    "INT64": np.int64,
    "INT32": np.int32,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}


def direct(repo: Path, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def inputs_for(feeds: dict[str, np.ndarray]) -> list[tg.InferInput]:
    out = []
    for name, array in feeds.items():
        tensor = tg.InferInput(name, list(array.shape), tg.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


@pytest.fixture(scope="module")
def client(agent):
    return tg.InferenceServerClient(agent.grpc_url)


def test_server_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "edgeplex"
    assert "model_repository" in meta.extensions


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


def silero_feeds() -> dict[str, np.ndarray]:
    """One 32 ms chunk of quiet noise at 16 kHz, with a fresh state."""
    rng = np.random.default_rng(1)
    return {
        "input": rng.standard_normal((1, 512), dtype=np.float32) * 0.1,
        "state": np.zeros((2, 1, 128), dtype=np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }


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
