"""config.pbtxt's `optimization.graph.level`: the level ONNX Runtime optimizes a
model's graph at, once, when it stages the model; each level its own staged copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as th

from edgeplex.agent.catalog import demo
from edgeplex.agent.runners.sessions import STAGED_MODEL, stage_model
from tests.conftest import start_agent

MLP = """
max_batch_size: 8
optimization { graph { level: 2 } priority: PRIORITY_MAX }
"""


def _ops(staged: Path) -> list[str]:
    model = onnx.load(str(staged / STAGED_MODEL), load_external_data=False)
    return [node.op_type for node in model.graph.node]


def test_the_staged_graph_is_optimized_at_the_level_asked(tmp_path: Path) -> None:
    demo.make_mlp(tmp_path / "mlp", width=64, layers=2, in_width=32)
    graph = tmp_path / "mlp" / "1" / "model.onnx"
    for level in ("disabled", "extended"):
        stage_model(graph, tmp_path / level, {}, ["CPUExecutionProvider"], level)
    assert _ops(tmp_path / "disabled") == ["Gemm", "Relu", "Gemm"]  # as exported
    assert "FusedGemm" in _ops(tmp_path / "extended")  # Gemm and Relu, one kernel


def test_a_model_served_at_its_own_level(tmp_path: Path) -> None:
    repo, staging = tmp_path / "repo", tmp_path / "staging"
    demo.make_mlp(repo / "plain", width=64, layers=2, in_width=32)
    shutil.copytree(repo / "plain", repo / "unoptimized")
    (repo / "unoptimized" / "config.pbtxt").write_text(MLP)
    shutil.copytree(repo / "plain", repo / "wrong")
    (repo / "wrong" / "config.pbtxt").write_text(MLP.replace("level: 2", "level: 3"))
    agent = start_agent(repo, tmp_path, env={"EDGEPLEX_AGENT_STAGING_DIR": str(staging)})
    client = th.InferenceServerClient(agent.http_url)
    try:
        x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
        answers = []
        for model in ("plain", "unoptimized"):
            tensor = th.InferInput("input", [2, 32], "FP32")
            tensor.set_data_from_numpy(x)
            answers.append(client.infer(model, [tensor]).as_numpy("output"))
        np.testing.assert_allclose(answers[0], answers[1], rtol=1e-5, atol=1e-6)
        [copy] = (staging / "unoptimized" / "1").glob("*-disabled")
        assert _ops(copy) == ["Gemm", "Relu", "Gemm"]
        assert "FusedGemm" in _ops(next((staging / "plain" / "1").iterdir()))

        assert client.get_model_config("unoptimized")["optimization"] == {"graph": {"level": 2}}
        status = {m["name"]: m for m in client.get_model_repository_index()}
        assert (
            "optimization.graph.level: '3' is not one of -1, 0, 1, 2" in status["wrong"]["reason"]
        )
    finally:
        client.close()
        assert agent.stop() == 0, agent.log()
    warned = "optimization.priority is not supported and has no effect"
    assert warned in agent.log()
