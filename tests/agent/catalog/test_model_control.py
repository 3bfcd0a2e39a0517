"""Model control as Triton's --model-control-mode defines it, through the stock
tritonclient: explicit (only loaded models serve; load and unload open on loopback),
poll (the repository rescanned), a load's config override, and the repository index
naming folders that hold nothing servable."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.frontdoor.auth import Access, Credentials
from edgeplex.agent.oip.errors import Unauthenticated
from tests.conftest import start_agent
from tests.support.sequences import make_from_a_hundred, value_input

pytestmark = pytest.mark.slow

ADD_SUB = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
         { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
"""


def _repository(root: Path) -> Path:
    repo = root / "repo"
    demo.make_add_sub(repo / "simple")
    (repo / "simple" / "config.pbtxt").write_text(ADD_SUB)
    demo.make_add_sub(repo / "other")
    plan = repo / "a_tensorrt_plan"
    (plan / "1").mkdir(parents=True)
    (plan / "1" / "model.plan").write_bytes(b"not onnx")
    (plan / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    ensemble = repo / "an_ensemble"
    (ensemble / "1").mkdir(parents=True)
    (ensemble / "config.pbtxt").write_text('platform: "ensemble"\n')
    demo.make_add_sub(repo / "gpu_only")
    (repo / "gpu_only" / "config.pbtxt").write_text("instance_group [ { kind: KIND_GPU } ]\n")
    return repo


def _infer(client: tg.InferenceServerClient, model: str) -> np.ndarray:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [tg.InferInput("INPUT0", [1, 16], "FP32"), tg.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    result = client.infer(model, inputs)
    return result.as_numpy("OUTPUT0")


def _top(client: tg.InferenceServerClient) -> bytes:
    """The top class of the simple model's OUTPUT0 for _infer's inputs."""
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [tg.InferInput("INPUT0", [1, 16], "FP32"), tg.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.float32))
    asked = [tg.InferRequestedOutput("OUTPUT0", class_count=1)]
    return bytes(client.infer("simple", inputs, outputs=asked).as_numpy("OUTPUT0")[0][0])


def _sequence_start(client: tg.InferenceServerClient, value: int) -> int:
    """A new sequence of from_a_hundred, sent `value` and ended: its first sum."""
    result = client.infer("from_a_hundred", [value_input(tg, value)], sequence_id=7,
                          sequence_start=True, sequence_end=True)  # fmt: skip
    return int(result.as_numpy("OUTPUT")[0][0])


def _failure(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.message())


def test_explicit_mode_serves_only_loaded_models_with_loopback_control(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    agent = start_agent(
        repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_MODEL_CONTROL_MODE": "explicit",
            "EDGEPLEX_AGENT_LOAD_MODEL": json.dumps(["other"]),
        },
    )
    client = tg.InferenceServerClient(agent.grpc_url)  # no token: a loopback client
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert set(index) == {"simple", "other", "a_tensorrt_plan", "an_ensemble", "gpu_only"}
        assert (index["other"].state, index["simple"].state) == ("READY", "UNAVAILABLE")
        assert index["simple"].reason == "unloaded"
        assert "platform 'tensorrt_plan' is not supported" in index["a_tensorrt_plan"].reason
        assert index["an_ensemble"].reason.startswith("ensemble: "), index["an_ensemble"]
        assert client.is_model_ready("other") and not client.is_model_ready("simple")
        said = _failure(lambda: _infer(client, "simple"))
        assert said.startswith("Request for unknown model: 'simple' has no available versions")

        client.load_model("simple")
        assert client.is_model_ready("simple")
        np.testing.assert_array_equal(_infer(client, "simple"), np.arange(1, 17).reshape(1, 16))

        # A config override: malformed, then as Triton's example sends it.
        bad = '"parameters": {"config": {{"max_batch_size": "16"}}}'
        assert "failed to load" in _failure(lambda: client.load_model("simple", config=bad))
        assert client.is_model_ready("simple")  # still serving under its own config
        client.load_model("simple", config='{"max_batch_size":"16"}')
        assert client.get_model_config("simple").config.max_batch_size == 16
        np.testing.assert_array_equal(_infer(client, "simple"), np.arange(1, 17).reshape(1, 16))
        client.load_model("simple")  # without one: config.pbtxt again
        assert client.get_model_config("simple").config.max_batch_size == 8

        files = {"file:" + "A" * 256: b"a"}
        said = _failure(lambda: client.load_model("simple", config="{}", files=files))
        assert "Invalid file path" in said
        said = _failure(lambda: client.load_model("simple", files={"file:1/model.onnx": b"x"}))
        assert "'files' parameter is not supported" in said
        assert "failed to load" in _failure(lambda: client.load_model("wrong_model_name"))
        said = _failure(lambda: client.load_model("gpu_only"))
        assert "KIND_GPU needs a GPU" in said, said

        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        assert "has no available versions" in _failure(lambda: _infer(client, "simple"))

        http = th.InferenceServerClient(agent.http_url)  # the HTTP door: the same verbs
        http.load_model("simple", config=json.dumps({"max_batch_size": 4}))
        assert http.get_model_config("simple")["max_batch_size"] == 4
        http.unload_model("simple")
        assert not http.is_model_ready("simple")
        assert agent.stop() == 0, agent.log()
    finally:
        client.close()
        agent.stop()


def test_control_needs_the_admin_token_except_from_loopback_in_explicit_mode() -> None:
    explicit = Credentials("admin", None, loopback_control=True)
    explicit.check(Access.CONTROL, None, "load", "ipv4:127.0.0.1:5000")
    explicit.check(Access.CONTROL, None, "load", "ipv6:[::1]:5000")
    explicit.check(Access.CONTROL, None, "load", "127.0.0.1")  # an HTTP door's address
    explicit.check(Access.CONTROL, "Bearer admin", "load", "ipv4:10.0.0.2:5000")
    with pytest.raises(Unauthenticated):
        explicit.check(Access.CONTROL, None, "load", "ipv4:10.0.0.2:5000")
    with pytest.raises(Unauthenticated):
        explicit.check(Access.ADMIN, None, "pin", "ipv4:127.0.0.1:5000")  # control only
    default = Credentials("admin", None)
    with pytest.raises(Unauthenticated):
        default.check(Access.CONTROL, None, "load", "ipv4:127.0.0.1:5000")


def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def test_poll_mode_follows_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_add_sub(repo / "simple")
    (repo / "simple" / "config.pbtxt").write_text(ADD_SUB)
    make_from_a_hundred(repo / "from_a_hundred")
    agent = start_agent(
        repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_MODEL_CONTROL_MODE": "poll",
            "EDGEPLEX_AGENT_REPOSITORY_POLL_SECS": "0.3",
        },
    )
    client = tg.InferenceServerClient(agent.grpc_url)
    try:
        _infer(client, "simple")
        demo.make_add_sub(repo / "added")  # a new model
        _until(lambda: "added" in {m.name for m in client.get_model_repository_index().models})
        np.testing.assert_array_equal(_infer(client, "added"), np.arange(1, 17).reshape(1, 16))

        # A changed config: the loaded model is loaded again under it.
        (repo / "simple" / "config.pbtxt").write_text(
            ADD_SUB.replace("max_batch_size: 8", "max_batch_size: 4")
        )
        _until(lambda: client.get_model_config("simple").config.max_batch_size == 4)
        _infer(client, "simple")
        # A changed label file: the classes are named from the new one.
        (repo / "simple" / "labels.txt").write_text("".join(f"a{i}\n" for i in range(16)))
        labelled = ADD_SUB.replace("max_batch_size: 8", "max_batch_size: 4").replace(
            'name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ]',
            'name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ], label_filename: "labels.txt"',
        )
        (repo / "simple" / "config.pbtxt").write_text(labelled)
        _until(lambda: _top(client) == b"16.000000:15:a15")
        (repo / "simple" / "labels.txt").write_text("".join(f"b{i}\n" for i in range(16)))
        _until(lambda: _top(client) == b"16.000000:15:b15")
        # A changed initial state, of the same size: new sequences start from it.
        assert _sequence_start(client, 5) == 105
        state = repo / "from_a_hundred" / "initial_state" / "hundred"
        state.write_bytes(np.array([200], np.int32).tobytes())
        _until(lambda: _sequence_start(client, 5) == 205)

        shutil.rmtree(repo / "added")  # a removed model
        _until(lambda: not client.is_model_ready("added"))
        assert "has no available versions" in _failure(lambda: _infer(client, "added"))
        assert agent.stop() == 0, agent.log()
    finally:
        client.close()
        agent.stop()
