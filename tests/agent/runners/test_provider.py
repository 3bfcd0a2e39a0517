"""A model runs on the execution provider it asked for, or fails saying why: asked
for CUDA where ONNX Runtime cannot give it (this machine's CPU-only build), a
model is FAILED with the reason, unless `runner.cpu_fallback` lets it serve on
the CPU, and then its status and a metric say so."""

from __future__ import annotations

import time

import onnxruntime as ort
import pytest

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent
from tests.support.agent import infer_http, status

pytestmark = pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(),
    reason="this ONNX Runtime has CUDA: the fallback cannot be shown",
)


def settle(agent, model: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = status(agent)[model]
        if state["state"] in ("READY", "FAILED"):
            return state
        time.sleep(0.1)
    raise AssertionError(f"{model} never settled: {status(agent)[model]}")


def test_cuda_asked_and_not_given_fails_the_model_with_the_reason(tmp_path):
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64, config="pin: true\n")
    agent = start_agent(
        repo, tmp_path, env={"EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER": "cuda"}, wait_ready=False
    )
    try:
        state = settle(agent, "m")
        assert state["state"] == "FAILED", state
        assert "CUDA" in state["reason"] and "cpu_fallback" in state["reason"], state
        code, _, body = infer_http(agent, "m")
        assert code >= 400 and "CUDA" in body["error"], body
    finally:
        assert agent.stop() == 0, agent.log()


def test_cpu_fallback_serves_and_says_so(tmp_path):
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64, config="pin: true\n")
    agent = start_agent(
        repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER": "cuda",
            "EDGEPLEX_AGENT_RUNNER__CPU_FALLBACK": "true",
        },
        wait_ready=False,
    )
    try:
        state = settle(agent, "m")
        assert state["state"] == "READY", state
        assert state["last_promotion"]["provider"] == "cpu"
        assert infer_http(agent, "m")[0] == 200
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'edgeplex_model_cpu_fallback{model="m"} 1.0' in metrics
    finally:
        assert agent.stop() == 0, agent.log()
