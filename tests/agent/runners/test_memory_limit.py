"""A dedicated runner over its host memory limit fails its own model only."""

from __future__ import annotations

import json
import time

import pytest

from edgeplex.agent import demo
from tests.agent.residency.test_overcommit import infer_http, status
from tests.conftest import start_agent

pytestmark = pytest.mark.slow


def test_dedicated_runner_over_its_memory_limit_fails_alone(tmp_path):
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "ok", width=256, layers=2, in_width=64)
    demo.make_mlp(
        repo / "greedy",
        width=2048,
        layers=6,
        in_width=64,  # ~84 MB of weights
        config="isolation: dedicated\nmemory_limit: 48MiB\n",
    )
    agent = start_agent(
        repo, tmp_path, env={"EDGEPLEX_AGENT_RUNNER__RESTART_BACKOFF_INITIAL_S": "0.05"}
    )
    try:
        memory = json.loads(agent.http_get("/edgeplex/v1/memory")[1])
        assert memory["runner_memory_limits"] in ("cgroup2", "cgroup1", "rlimit")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and status(agent)["greedy"]["state"] != "FAILED":
            time.sleep(0.1)
        greedy = status(agent)["greedy"]
        assert greedy["state"] == "FAILED", greedy
        assert infer_http(agent, "ok")[0] == 200
        assert status(agent)["ok"]["state"] == "READY"
        print(f"limit via {memory['runner_memory_limits']}: {greedy['reason']}")
    finally:
        assert agent.stop() == 0, agent.log()
