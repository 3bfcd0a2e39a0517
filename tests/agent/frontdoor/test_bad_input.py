"""Every kind of bad input gets a clear error naming what is wrong, and the agent
keeps serving everything else."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import start_agent
from tests.support.oip import inputs_for


@pytest.fixture(scope="module")
def client(agent):
    return tg.InferenceServerClient(agent.grpc_url)


@pytest.fixture(scope="module")
def stub(agent):
    with grpc.insecure_channel(agent.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


def http_post(agent, path: str, body: bytes, headers: dict[str, str] | None = None):
    request = urllib.request.Request(
        f"http://{agent.http_url}{path}", data=body, headers=headers or {}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def ones(*shape, dtype=np.float32):
    return np.ones(shape, dtype=dtype)


def add_sub_ok(client) -> None:
    result = client.infer("add_sub", inputs_for({"INPUT0": ones(1, 16), "INPUT1": ones(1, 16)}))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * ones(1, 16))


# --- gRPC ------------------------------------------------------------------------------


def test_unknown_model_is_not_found(client):
    err = grpc_error(lambda: client.infer("no_such_model", inputs_for({"x": ones(1)})))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in err.message()


@pytest.mark.parametrize(
    "feeds,needle",
    [
        ({"INPUT0": ones(1, 16, dtype=np.int32), "INPUT1": ones(1, 16)}, "INPUT0"),
        ({"INPUT0": ones(1, 15), "INPUT1": ones(1, 15)}, "INPUT0"),
        ({"INPUT0": ones(1, 16, 1), "INPUT1": ones(1, 16)}, "INPUT0"),
        ({"INPUT0": ones(1, 16)}, "INPUT1"),
        ({"INPUT0": ones(1, 16), "INPUT1": ones(1, 16), "EXTRA": ones(1, 16)}, "EXTRA"),
        ({"INPUT0": ones(99, 16), "INPUT1": ones(99, 16)}, "INPUT0"),
    ],
)
def test_wrong_inputs_are_invalid_argument_naming_the_input(client, feeds, needle):
    err = grpc_error(lambda: client.infer("add_sub", inputs_for(feeds)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT", err.message()
    assert needle in err.message()
    add_sub_ok(client)


def test_wrong_element_count_in_raw_contents(stub, client):
    request = pb.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.extend([b"\0" * 64, b"\0" * 60])
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT1" in err.value.details() and "60" in err.value.details()


def test_wrong_typed_element_count(stub):
    request = pb.ModelInferRequest(model_name="identity_int32")
    request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 8]).contents.int_contents.extend(
        [1, 2, 3]
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT" in err.value.details()


def test_payload_over_the_cap_is_invalid_argument(client):
    big = ones(640_000, 8)  # 20 MB > the 16 MiB cap the fixture sets
    err = grpc_error(lambda: client.infer("identity_fp32", inputs_for({"INPUT": big})))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT" in err.message() and "cap" in err.message()
    add_sub_ok(client)


def test_broken_model_is_failed_with_a_reason_and_no_path(client, agent, model_repo):
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["broken"].state == "FAILED"
    assert index["broken"].reason
    _, body = agent.http_get("/edgeplex/v1/status")
    status = {m["name"]: m for m in json.loads(body)}
    for text in (index["broken"].reason, status["broken"]["reason"]):
        assert str(model_repo) not in text and "/tmp" not in text, text
    err = grpc_error(lambda: client.infer("broken", inputs_for({"x": ones(1)})))
    assert err.status() == "StatusCode.FAILED_PRECONDITION"
    assert str(model_repo) not in err.message()
    add_sub_ok(client)


def test_request_timeout_is_deadline_exceeded(client):
    err = grpc_error(
        lambda: client.infer("slow", inputs_for({"input": ones(8, 512, 512)}), timeout=50_000)
    )
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED"
    add_sub_ok(client)


def test_queue_full_is_resource_exhausted(agent):
    def call(_):
        local = tg.InferenceServerClient(agent.grpc_url)
        try:
            local.infer("slow", inputs_for({"input": ones(8, 512, 512)}))
            return "ok"
        except InferenceServerException as exc:
            return exc.status()

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(call, range(8)))
    assert "StatusCode.RESOURCE_EXHAUSTED" in outcomes
    assert "ok" in outcomes
    assert set(outcomes) <= {"ok", "StatusCode.RESOURCE_EXHAUSTED"}


# --- HTTP ------------------------------------------------------------------------------


def test_http_malformed_json_is_400(agent):
    status, _, body = http_post(agent, "/v2/models/add_sub/infer", b"{not json")
    assert status == 400
    assert "JSON" in json.loads(body)["error"]


def test_http_unknown_model_is_404(agent):
    status, _, body = http_post(agent, "/v2/models/nope/infer", b'{"inputs": []}')
    assert status == 404 and "nope" in json.loads(body)["error"]


def test_unknown_models_and_versions_are_named_in_tritons_words(agent, client):
    """Triton's examples and users' scripts match the start of these messages."""
    status, _, body = http_post(agent, "/v2/models/nope/infer", b'{"inputs": []}')
    assert json.loads(body)["error"].startswith("Request for unknown model: 'nope' is not found")
    status, _, body = http_post(agent, "/v2/models/add_sub/versions/99/infer", b'{"inputs": []}')
    assert status == 404
    message = json.loads(body)["error"]
    assert message.startswith("Request for unknown model: 'add_sub' version 99 is not found")
    with pytest.raises(InferenceServerException) as unknown:
        client.get_model_metadata("nope")
    assert unknown.value.message().startswith("Request for unknown model: 'nope' is not found")
    wrong_type = [
        tg.InferInput("INPUT0", [1, 16], "INT32"),
        tg.InferInput("INPUT1", [1, 16], "FP32"),
    ]
    wrong_type[0].set_data_from_numpy(np.ones((1, 16), np.int32))
    wrong_type[1].set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("add_sub", wrong_type)
    assert refused.value.message() == (
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    )
    wrong_shape = [tg.InferInput(n, [2, 8], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in wrong_shape:
        tensor.set_data_from_numpy(np.ones((2, 8), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("add_sub", wrong_shape)
    assert refused.value.message() == (
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [2,8]"
    )
    mixed = pb.ModelInferRequest(model_name="add_sub", raw_input_contents=[b"\0" * 64] * 2)
    for name in ("INPUT0", "INPUT1"):
        mixed.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    mixed.inputs[1].contents.fp32_contents.extend([1.0] * 16)
    with (
        grpc.insecure_channel(agent.grpc_url) as channel,
        pytest.raises(grpc.RpcError) as refused_raw,
    ):
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(mixed)
    assert refused_raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused_raw.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT1' "
        "for model 'add_sub'"
    )
    # Every HTTP error body is JSON, the door's own refusals too.
    status, body = agent.http_get("/v2/no/such/route")
    assert status == 404 and json.loads(body) == {"error": "404: Not Found"}
    status, _, body = http_post(agent, "/v2/health/live", b"")
    assert status == 405 and "error" in json.loads(body)


def test_the_aiohttp_door_answers_unknown_routes_in_json_too(tmp_path):
    """http_server: aiohttp (where httptools is missing) answers as the native door."""
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    other = start_agent(tmp_path / "repo", tmp_path, env={"EDGEPLEX_AGENT_HTTP_SERVER": "aiohttp"})
    try:
        status, body = other.http_get("/v2/no/such/route")
        assert status == 404 and json.loads(body) == {"error": "404: Not Found"}
        status, _, body = http_post(other, "/v2/health/live", b"")
        assert status == 405 and json.loads(body) == {"error": "405: Method Not Allowed"}
        assert other.http_get("/v2/health/live")[0] == 200
    finally:
        assert other.stop() == 0, other.log()


@pytest.mark.parametrize(
    "inputs,needle",
    [
        (
            [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
            ],
            "INPUT0",
        ),
        (
            [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1] * 15},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
            ],
            "INPUT0",
        ),
        ([{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16}], "INPUT1"),
        (
            [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ["a"] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
            ],
            "INPUT0",
        ),
    ],
)
def test_http_wrong_inputs_are_400_naming_the_input(agent, inputs, needle):
    status, _, body = http_post(
        agent, "/v2/models/add_sub/infer", json.dumps({"inputs": inputs}).encode()
    )
    assert status == 400
    assert needle in json.loads(body)["error"]


@pytest.mark.parametrize("dim", ["Infinity", "-Infinity", "NaN", "1e30", "1.5"])
def test_http_a_shape_that_is_no_integer_is_400(agent, dim):
    tensor = '{"name": "INPUT0", "shape": [DIM], "datatype": "FP32", "data": [1.0]}'
    body = '{"inputs": [' + tensor.replace("DIM", dim) + "]}"
    status, _, reply = http_post(agent, "/v2/models/add_sub/infer", body.encode())
    assert status == 400, reply
    assert "shape" in json.loads(reply)["error"]


def test_http_binary_size_mismatch_is_400(agent):
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT",
                    "shape": [1, 8],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 32},
                }
            ]
        }
    ).encode()
    status, _, body = http_post(
        agent,
        "/v2/models/identity_fp32/infer",
        header + b"\0" * 31,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400 and "INPUT" in json.loads(body)["error"]


def test_http_timeout_is_504_and_queue_full_is_429(agent):
    doc = {
        "inputs": [
            {
                "name": "input",
                "shape": [8, 512, 512],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 8 * 512 * 512 * 4},
            }
        ],
        "parameters": {"timeout": 50_000},
    }
    header = json.dumps(doc).encode()
    body = header + bytes(8 * 512 * 512 * 4)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, _, _ = http_post(agent, "/v2/models/slow/infer", body, headers)
    assert status == 504
    del doc["parameters"]
    header = json.dumps(doc).encode()
    body = header + bytes(8 * 512 * 512 * 4)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(lambda _: http_post(agent, "/v2/models/slow/infer", body, headers), range(8))
        )
    codes = [r[0] for r in results]
    assert 429 in codes and 200 in codes
    assert all(r[1].get("Retry-After") for r in results if r[0] == 429)


def test_http_error_bodies_name_no_paths(agent, model_repo):
    status, _, body = http_post(agent, "/v2/models/broken/infer", b'{"inputs": []}')
    assert status in (409, 503)
    assert str(model_repo) not in body.decode()


def test_global_inflight_caps_refuse_with_429(model_repo, tmp_path):
    """Beyond max_inflight_requests (here 2) or max_inflight_bytes, requests are refused
    before they are read, with Retry-After; those admitted succeed."""
    from tests.conftest import start_agent

    capped = start_agent(
        model_repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_MAX_INFLIGHT_REQUESTS": "2",
            "EDGEPLEX_AGENT_MAX_INFLIGHT_BYTES": "12MiB",
        },
    )
    try:
        doc = {"inputs": [{"name": "input", "shape": [2, 512, 512], "datatype": "FP32"}]}
        doc["inputs"][0]["parameters"] = {"binary_data_size": 2 * 512 * 512 * 4}
        header = json.dumps(doc).encode()
        body = header + bytes(2 * 512 * 512 * 4)
        headers = {"Inference-Header-Content-Length": str(len(header))}
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda _: http_post(capped, "/v2/models/slow/infer", body, headers), range(8)
                )
            )
        refused = [r for r in results if r[0] == 429 and b"the agent holds" in r[2]]
        assert refused, [(r[0], r[2][:80]) for r in results]
        assert all(r[1].get("Retry-After") for r in refused)
        assert all(r[0] in (200, 429) for r in results)
        big = json.dumps({"inputs": []}).encode() + bytes(13 << 20)
        status, _, reply = http_post(
            capped, "/v2/models/slow/infer", big, {"Inference-Header-Content-Length": "14"}
        )
        assert status == 429 and b"bytes" in reply
        status, _, _ = http_post(capped, "/v2/models/slow/infer", body, headers)
        assert status == 200
    finally:
        assert capped.stop() == 0, capped.log()
