"""The agent over HTTP/REST, driven by the stock tritonclient.http and by raw requests,
through both HTTP doors (native and aiohttp)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as th

from tests.conftest import AUTH, running_agent
from tests.support.oip import DTYPES, direct, silero_feeds


def inputs_for(feeds, binary=True):
    out = []
    for name, array in feeds.items():
        tensor = th.InferInput(name, list(array.shape), th.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        out.append(tensor)
    return out


@pytest.fixture(scope="module", params=["native", "aiohttp"])
def agent(request, model_repo, tmp_path_factory):
    with running_agent(model_repo, tmp_path_factory, EDGEPLEX_AGENT_HTTP_SERVER=request.param) as a:
        yield a


@pytest.fixture(scope="module")
def client(agent):
    return th.InferenceServerClient(agent.http_url, concurrency=8)


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "edgeplex"
    meta = client.get_model_metadata("silero_vad")
    assert meta["inputs"][1] == {"name": "state", "datatype": "FP32", "shape": [2, -1, 128]}
    assert client.is_model_ready("add_sub")


@pytest.mark.parametrize("binary", [True, False])
def test_infer_matches_direct_onnxruntime(client, model_repo, binary):
    rng = np.random.default_rng(0)
    feeds = {
        "INPUT0": rng.standard_normal((2, 16), dtype=np.float32),
        "INPUT1": rng.standard_normal((2, 16), dtype=np.float32),
    }
    outputs = [
        th.InferRequestedOutput("OUTPUT0", binary_data=binary),
        th.InferRequestedOutput("OUTPUT1", binary_data=not binary),
    ]
    result = client.infer("add_sub_nobatch", inputs_for(feeds, binary), outputs=outputs)
    expected = direct(model_repo, "add_sub_nobatch", feeds)
    for name, value in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), value)


def test_real_packaged_model(client, model_repo):
    feeds = silero_feeds()
    result = client.infer("silero_vad", inputs_for(feeds))
    expected = direct(model_repo, "silero_vad", feeds)
    np.testing.assert_array_equal(result.as_numpy("output"), expected["output"])


@pytest.mark.parametrize("datatype", list(DTYPES))
@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips(client, datatype, binary):
    rng = np.random.default_rng(2)
    dtype = DTYPES[datatype]
    if dtype is np.bool_:
        array = rng.integers(0, 2, (2, 8)).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, (2, 8), dtype=dtype, endpoint=True)
    else:
        array = rng.standard_normal((2, 8)).astype(dtype)
    result = client.infer(
        f"identity_{datatype.lower()}",
        inputs_for({"INPUT": array}, binary),
        outputs=[th.InferRequestedOutput("OUTPUT", binary_data=binary)],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), array)


def test_large_binary_outputs_arrive_whole(client, model_repo):
    # 625 KiB per tensor: through the runner's shared rings, and written by the native
    # door as the header plus a view of each output array.
    rng = np.random.default_rng(4)
    feeds = {
        name: rng.standard_normal((10_000, 16), dtype=np.float32) for name in ("INPUT0", "INPUT1")
    }
    expected = direct(model_repo, "add_sub_nobatch", feeds)
    outputs = [th.InferRequestedOutput(name, binary_data=True) for name in ("OUTPUT0", "OUTPUT1")]
    for _ in range(3):
        result = client.infer("add_sub_nobatch", inputs_for(feeds), outputs=outputs)
        for name, value in expected.items():
            np.testing.assert_array_equal(result.as_numpy(name), value)


def test_batched_requests_match_within_tolerance(client, model_repo):
    rng = np.random.default_rng(3)
    requests = [
        {
            "INPUT0": rng.standard_normal((1, 16), dtype=np.float32),
            "INPUT1": rng.standard_normal((1, 16), dtype=np.float32),
        }
        for _ in range(16)
    ]
    # tritonclient.http is gevent-based: concurrency comes from async_infer, not threads.
    pending = [client.async_infer("add_sub", inputs_for(f)) for f in requests]
    results = [p.get_result() for p in pending]
    for feeds, result in zip(requests, results, strict=True):
        expected = direct(model_repo, "add_sub", feeds)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected["OUTPUT0"], atol=1e-5)


def test_statistics_index_load_unload(client):
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert stats["inference_count"] >= stats["execution_count"] > 0
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["broken"]["state"] == "FAILED"
    client.unload_model("identity_int8", headers=AUTH)
    assert not client.is_model_ready("identity_int8")
    client.load_model("identity_int8", headers=AUTH)
    assert client.is_model_ready("identity_int8")


def test_status_lists_every_model_with_runner_and_bytes(agent):
    status, body = agent.http_get("/edgeplex/v1/status")
    assert status == 200
    models = {m["name"]: m for m in json.loads(body)}
    add_sub = models["add_sub"]
    assert add_sub["state"] == "READY" and add_sub["version"] == "1"
    assert add_sub["runner_pid"] > 0 and add_sub["memory_bytes"] > 0
    assert models["mlp_dedicated"]["runner_pid"] != add_sub["runner_pid"]
    assert models["broken"]["state"] == "FAILED"


def test_metrics_are_exported(agent, client):
    client.infer(
        "add_sub",
        inputs_for(
            {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
        ),
    )
    status, body = agent.http_get("/metrics")
    text = body.decode()
    assert status == 200
    for name in (
        "edgeplex_agent_requests_total",
        "edgeplex_agent_request_failures_total",
        "edgeplex_agent_queue_duration_seconds",
        "edgeplex_agent_compute_duration_seconds",
        "edgeplex_agent_batch_size_requests",
        "edgeplex_runner_restarts_total",
    ):
        assert name in text, name
    assert 'edgeplex_agent_requests_total{model="add_sub"}' in text
    # Triton's names too, as Triton writes them: counters with no _total suffix.
    lines = text.splitlines()
    assert "# TYPE nv_inference_request_success counter" in lines
    success = next(
        line for line in lines
        if line.startswith('nv_inference_request_success{model="add_sub",version="1"}')
    )  # fmt: skip
    assert int(success.split()[-1]) >= 1
    for name in ("nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                 "nv_inference_compute_output_duration_us"):  # fmt: skip
        assert f"# TYPE {name} counter" in lines, name
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name for f in text_string_to_metric_families(text)}  # the whole page parses
    assert "nv_inference_count" in families
