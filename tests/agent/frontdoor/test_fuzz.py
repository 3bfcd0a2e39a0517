"""Property-based fuzzing of both front doors against a live agent: whatever the
body, the headers or the protobuf, the answer is never a 5xx (INTERNAL or
UNKNOWN over gRPC), the agent does not crash, and it still serves a valid
request afterwards. Plus the malformed inputs once found by hand, by name."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc

MODELS = ["add_sub", "add_sub_nobatch", "identity_int8", "identity_bool", "nope", ""]
DATATYPES = ["FP32", "FP16", "INT8", "INT64", "BOOL", "BYTES", "BF16", "fp32", ""]
FUZZ = settings(
    max_examples=1100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


def valid_body(width: int = 16) -> bytes:
    data = [1.0] * width
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, width], "datatype": "FP32", "data": data},
                {"name": "INPUT1", "shape": [1, width], "datatype": "FP32", "data": data},
            ]
        }
    ).encode()


class Http:
    """One keep-alive connection, reopened when the agent closes it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn = http.client.HTTPConnection(address, timeout=30)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        for attempt in range(2):
            try:
                self.conn.request("POST", path, body=body, headers=headers)
                reply = self.conn.getresponse()
                return reply.status, reply.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.address, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def web(agent):
    return Http(agent.http_url)


@pytest.fixture(scope="module")
def stub(agent):
    with grpc.insecure_channel(agent.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def still_serves(web: Http) -> None:
    status, body = web.post("/v2/models/add_sub/infer", valid_body(), {})
    assert status == 200, body


# --- by hand -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fault"),
    [
        (b"[" * 100_000, b"nests"),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [0, 1000000000000000000000000000000], '
            b'"datatype": "FP32", "data": []}]}',
            b"larger than",
        ),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", '
            b'"data": [1], "parameters": [1]}]}',
            b"'parameters' must be an object",
        ),
        (b'{"inputs": [], "outputs": [{"name": "OUTPUT0", "parameters": "x"}]}', b"must be"),
        (b'{"inputs": [], "parameters": {"timeout": "soon"}}', b"timeout"),
        (b'{"inputs": [], "id": 7}', b"'id' must be a string"),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "BYTES", '
            b'"data": false}]}',
            b"must be a list of BYTES",
        ),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": 1.5}]}',
            b"must be a list of FP32",
        ),
    ],
)
def test_malformed_bodies_get_400_naming_the_fault(web, body, fault):
    status, reply = web.post("/v2/models/add_sub/infer", body, {})
    assert status == 400, reply
    assert fault in reply
    still_serves(web)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_requests_are_decoded_once(web, encoding):
    body = valid_body()
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    status, reply = web.post("/v2/models/add_sub/infer", packed, {"Content-Encoding": encoding})
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == [2.0] * 16


def test_bad_compression_and_oversized_json_are_400(web):
    status, reply = web.post("/v2/models/add_sub/infer", b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and b"gzip" in reply
    status, reply = web.post("/v2/models/add_sub/infer", b"x", {"Content-Encoding": "br"})
    assert status == 400 and b"Content-Encoding" in reply
    bomb = gzip.compress(b" " * (40 << 20))  # 40 MiB of spaces, above the JSON cap
    status, reply = web.post("/v2/models/add_sub/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and b"cap" in reply, reply
    still_serves(web)


def test_unknown_models_mint_no_metric_series(agent, web):
    for i in range(5):
        status, _ = web.post(f"/v2/models/no-such-model-{i}/infer", valid_body(), {})
        assert status == 404
    _, metrics = agent.http_get("/metrics")
    assert b"no-such-model" not in metrics


# --- HTTP, generated --------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
shapes = st.lists(st.integers(-2, 2**64), max_size=5) | json_values
tensors = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT0", "INPUT1", "INPUT", "x"]) | json_values,
        "shape": st.one_of(st.just([1, 16]), st.just([2, 16]), shapes),
        "datatype": st.sampled_from(DATATYPES) | json_values,
    },
    optional={
        "data": st.one_of(st.just([1.0] * 16), st.lists(scalars, max_size=40), json_values),
        "parameters": st.one_of(
            st.fixed_dictionaries({"binary_data_size": st.integers(-4, 200) | json_values}),
            json_values,
        ),
    },
)
documents = st.fixed_dictionaries(
    {"inputs": st.lists(tensors, max_size=3) | json_values},
    optional={
        "outputs": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["OUTPUT0", "OUTPUT1", "zz"]) | json_values},
                optional={"parameters": json_values},
            ),
            max_size=3,
        )
        | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["timeout", "binary_data_output", "priority"]), json_values, max_size=3
        )
        | json_values,
        "id": json_values,
    },
)


FIELDS = ["shape", "datatype", "data", "name", "parameters"]


@st.composite
def near_valid(draw):
    """A valid add_sub request with one field replaced, so the fuzz reaches the
    checks behind the JSON shape (spec, batch, outputs, deadline, execution)."""
    doc = json.loads(valid_body())
    if draw(st.booleans()):
        tensor = doc["inputs"][draw(st.integers(0, 1))]
        tensor[draw(st.sampled_from(FIELDS))] = draw(json_values | shapes)
    else:
        doc[draw(st.sampled_from(["outputs", "parameters", "id"]))] = draw(
            json_values
            | st.just([{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
            | st.just({"binary_data_output": True, "timeout": 1})
        )
    return doc


@st.composite
def http_requests(draw):
    kind = draw(st.sampled_from(["document", "bytes", "binary", "near", "near"]))
    headers: dict[str, str] = {}
    if kind == "near":
        body = json.dumps(draw(near_valid())).encode()
    elif kind == "bytes":
        body = draw(st.binary(max_size=300))
    else:
        body = json.dumps(draw(documents)).encode()
        if kind == "binary":
            header_length = len(body)
            body += draw(st.binary(max_size=200))
            headers["Inference-Header-Content-Length"] = draw(
                st.sampled_from([str(header_length), str(header_length + 3), "-1", "x", "9" * 30])
            )
    encoding = draw(
        st.sampled_from(["", "gzip", "deflate", "identity", "GZIP", "br", "gzip, gzip"])
    )
    if encoding:
        headers["Content-Encoding"] = encoding
        if encoding.lower() == "gzip" and draw(st.booleans()):
            body = gzip.compress(body)
        elif encoding == "deflate" and draw(st.booleans()):
            body = zlib.compress(body)
    model = "add_sub" if kind == "near" else draw(st.sampled_from(MODELS))
    version = draw(st.sampled_from(["", "", "/versions/1", "/versions/9", "/versions/%2e%2e"]))
    return f"/v2/models/{model}{version}/infer", body, headers


@FUZZ
@given(request=http_requests())
def test_http_fuzz_never_5xx(web, request):
    path, body, headers = request
    status, reply = web.post(path, body, headers)
    # 504 is the answer a request with a tiny `timeout` asked for.
    assert status < 500 or (status == 504 and b"timed out" in reply), (status, reply[:300])


def test_http_fuzz_leaves_the_agent_serving(agent, web):
    still_serves(web)
    assert agent.process.poll() is None


# --- gRPC, generated ----------------------------------------------------------------------

int64s = st.integers(-(2**63), 2**63 - 1)


@st.composite
def grpc_requests(draw):
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(MODELS) | st.text(max_size=10)),
        model_version=draw(st.sampled_from(["", "1", "9", "x"])),
        id=draw(st.text(max_size=8)),
    )
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["INPUT0", "INPUT1", "INPUT", ""]) | st.text(max_size=6)),
            datatype=draw(st.sampled_from(DATATYPES)),
            shape=draw(st.sampled_from([[1, 16], [2, 16], [1, 4]]) | st.lists(int64s, max_size=4)),
        )
        if raw:
            request.raw_input_contents.append(
                draw(st.sampled_from([np.ones(16, np.float32).tobytes()]) | st.binary(max_size=80))
            )
        else:
            values = draw(st.lists(st.floats(width=32), max_size=40))
            tensor.contents.fp32_contents.extend(values)
            tensor.contents.int_contents.extend(
                draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8))
            )
    if raw and draw(st.booleans()):
        request.raw_input_contents.append(b"extra")
    for name in draw(st.lists(st.sampled_from(["OUTPUT0", "OUTPUT1", "zz"]), max_size=2)):
        request.outputs.add(name=name)
    if draw(st.booleans()):
        request.parameters["timeout"].int64_param = draw(int64s)
    return request


@FUZZ
@given(request=grpc_requests())
def test_grpc_fuzz_never_internal(stub, request):
    try:
        stub.ModelInfer(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), exc.details()


def test_grpc_fuzz_leaves_the_agent_serving(agent, web):
    still_serves(web)
    assert agent.process.poll() is None
