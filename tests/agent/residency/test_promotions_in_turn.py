"""Promotions in turn through a budget for one model: each model of one graph
answers with its own weights however often the shared session changes hands,
and a load that fails fails the request waiting for it at once, with the model
named, and leaves the other models serving."""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    repo = tmp_path_factory.mktemp("in-turn")
    for i in range(3):
        demo.make_mlp(repo / f"m{i}", width=512, layers=3, seed=i, in_width=64)
    # Reads as a model (its inputs and outputs are declared), but no session of it can
    # be created: ONNX Runtime has no kernel for its one node.
    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["input"], ["output"])],
        "unloadable",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 64])],
    )
    (repo / "unloadable" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph), str(repo / "unloadable" / "1" / "model.onnx"))
    proc = start_agent(
        repo,
        tmp_path_factory.mktemp("in-turn-logs"),
        env={
            "EDGEPLEX_AGENT_LOAD_MODELS_AT_START": "false",
            "EDGEPLEX_AGENT_PRESTAGE": "false",
            # Room for one model of the three: every other request waits for a promotion.
            "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": "3MiB",  # models of 2.2 MB
        },
    )
    yield proc
    assert proc.stop() == 0, proc.log()


def infer(agent, model: str, x: np.ndarray) -> tuple[int, dict]:
    code, body, _ = infer_with_headers(agent, model, x)
    return code, body


def infer_with_headers(agent, model: str, x: np.ndarray) -> tuple[int, dict, dict]:
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.tolist()}]}
    ).encode()
    request = urllib.request.Request(
        f"http://{agent.http_url}/v2/models/{model}/infer", data=body, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def test_promotions_in_turn_answer_each_model_with_its_own_weights(agent):
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    first = {}
    for round_ in range(3):
        for i in range(3):
            code, body, headers = infer_with_headers(agent, f"m{i}", x)
            assert code == 200, body
            assert headers.get("edgeplex-cold-start"), (round_, i)  # each one promoted
            out = body["outputs"][0]["data"]
            assert first.setdefault(i, out) == out, (round_, i)
    assert len({json.dumps(v) for v in first.values()}) == 3


def test_a_failed_load_fails_the_request_waiting_for_it_and_nothing_else(agent):
    x = np.zeros(64, np.float32)
    assert infer(agent, "m0", x)[0] == 200
    started = time.monotonic()
    code, body = infer(agent, "unloadable", x)
    assert code == 409 and "failed to load 'unloadable'" in body["error"], (code, body)
    assert "NoSuchOperator" in body["error"]  # the reason, as ONNX Runtime gave it
    assert time.monotonic() - started < 10
    status = {m["name"]: m for m in json.loads(agent.http_get("/edgeplex/v1/status")[1])}
    assert status["unloadable"]["state"] == "FAILED"
    for i in range(3):
        assert infer(agent, f"m{i}", x)[0] == 200
