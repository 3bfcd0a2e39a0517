"""config.pbtxt's `optional` inputs, as Triton's onnxruntime backend serves them: a
graph input that an initializer gives a default may be left out of a request, and
ONNX Runtime runs with the default; a model that batches, or an input without a
default, fails with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto, helper, save
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.catalog.repository import scan_model
from edgeplex.agent.residency.describe import Described, describe
from tests.conftest import AUTH, start_agent
from tests.support.agent import post

# OUTPUT = INPUT * SCALE, SCALE 2 unless a request sends it.
SCALED = """
name: "scaled"
max_batch_size: 0
input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ 4 ] },
        { name: "SCALE", data_type: TYPE_FP32, dims: [ 1 ], optional: true } ]
output [ { name: "OUTPUT", data_type: TYPE_FP32, dims: [ 4 ] } ]
model_warmup [ { name: "without the scale" batch_size: 1 inputs { key: "INPUT" value:
                 { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
"""


def make_scaled(directory: Path, config: str, batch: bool = False, ir_version: int = 8) -> None:
    dims: list[int | str] = ["batch", 4] if batch else [4]
    scale = helper.make_tensor("SCALE", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT", "SCALE"], ["OUTPUT"])],
        directory.name,
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, dims),
         helper.make_tensor_value_info("SCALE", TensorProto.FLOAT, [*dims[:-1], 1])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, dims)],
        [scale],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    (directory / "1").mkdir(parents=True)
    save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(config.replace('"scaled"', f'"{directory.name}"'))


def _tensor(client, name: str, values: list[float]):  # type: ignore[no-untyped-def]
    module = tg if isinstance(client, tg.InferenceServerClient) else th
    tensor = module.InferInput(name, [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, np.float32))
    return tensor


def _infer(client, scale: float | None = None) -> np.ndarray:  # type: ignore[no-untyped-def]
    inputs = [_tensor(client, "INPUT", [0, 1, 2, 3])]
    if scale is not None:
        inputs.append(_tensor(client, "SCALE", [scale]))
    return client.infer("scaled", inputs).as_numpy("OUTPUT")


def test_an_optional_input_left_out_takes_the_graphs_default(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_scaled(repo / "scaled", SCALED)
    # A model that batches may not have one (Triton's words).
    make_scaled(
        repo / "batched", SCALED.replace("max_batch_size: 0", "max_batch_size: 4"), batch=True
    )
    # An input the graph has no default for cannot be left out.
    no_default = SCALED.replace("dims: [ 4 ] },", "dims: [ 4 ], optional: true },")
    make_scaled(repo / "no_default", no_default)
    # A defaulted input declared as a required one is named.
    required = SCALED.replace(", optional: true", "")
    make_scaled(repo / "undeclared", required[: required.index("model_warmup")])
    agent = start_agent(repo, tmp_path)
    try:
        for client in (
            tg.InferenceServerClient(agent.grpc_url),
            th.InferenceServerClient(agent.http_url),
        ):
            np.testing.assert_array_equal(_infer(client), [0, 2, 4, 6])
            np.testing.assert_array_equal(_infer(client, 3.0), [0, 3, 6, 9])
            np.testing.assert_array_equal(_infer(client), [0, 2, 4, 6])  # nothing kept
            with pytest.raises(InferenceServerException, match="missing input 'INPUT'"):
                client.infer("scaled", [_tensor(client, "SCALE", [3.0])])
        http = th.InferenceServerClient(agent.http_url)
        config = http.get_model_config("scaled")
        assert [(i["name"], i["optional"]) for i in config["input"]] == [
            ("INPUT", False),
            ("SCALE", True),
        ]
        grpc_config = tg.InferenceServerClient(agent.grpc_url).get_model_config("scaled")
        assert [i.optional for i in grpc_config.config.input] == [False, True]
        http.load_model("scaled", headers=AUTH)  # its warm-up sample leaves SCALE out
        np.testing.assert_array_equal(_infer(http), [0, 2, 4, 6])
        for tier in ("staged", "cached"):  # loaded again from its staged copy, then the file
            assert post(agent, "/edgeplex/v1/models/scaled/demote", {"tier": tier}) == 200
            np.testing.assert_array_equal(_infer(http), [0, 2, 4, 6])
            np.testing.assert_array_equal(_infer(http, 0.5), [0, 0.5, 1, 1.5])

        status = {m["name"]: m for m in http.get_model_repository_index()}
        for name, why in (
            ("batched", "optional input 'SCALE' is not supported for models that support batching"),
            ("no_default", "input 'INPUT' is optional, and the graph has no default for it"),
            ("undeclared", "input 'SCALE' has a default in the graph (an initializer)"),
        ):
            with pytest.raises(InferenceServerException):
                http.infer(name, [])
            assert why in status[name]["reason"], status[name]
        http.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_before_ir_version_4_a_graphs_weights_have_no_default_to_leave_out(tmp_path: Path) -> None:
    """IR versions before 4 list every weight as a graph input, fixed: ONNX Runtime
    takes no value for it, so config.pbtxt cannot declare it an input."""
    for ir_version in (3, 8):
        make_scaled(tmp_path / f"ir{ir_version}", SCALED, ir_version=ir_version)
    described = {
        ir: describe(ir, scan_model(tmp_path, f"ir{ir}", ModelConfig()))  # type: ignore[arg-type]
        for ir in (3, 8)
    }
    assert described[3] == "config.pbtxt declares input 'SCALE'; the graph's inputs are INPUT"
    assert isinstance(described[8], Described)
    assert [(i.name, i.optional) for i in described[8].inputs] == [
        ("INPUT", False),
        ("SCALE", True),
    ]
