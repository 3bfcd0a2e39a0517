"""A runner over its host memory limit dies alone: the kernel kills it in its own
group, the agent names the limit, and every other model keeps serving."""

from __future__ import annotations

import json
import threading
import time

import pytest

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent
from tests.support.agent import infer_http, status

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
        repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_RUNNER__RESTART_BACKOFF_INITIAL_S": "0.05",
            "EDGEPLEX_AGENT_LOAD_MODELS_AT_START": "false",  # greedy loads when asked
        },
    )
    try:
        memory = json.loads(agent.http_get("/edgeplex/v1/memory")[1])
        assert memory["runner_memory_limits"] in ("cgroup2", "cgroup1", "rlimit")
        codes: list[int] = []
        done = threading.Event()

        def victim() -> None:  # another model, asked throughout
            while not done.is_set():
                codes.append(infer_http(agent, "ok")[0])

        thread = threading.Thread(target=victim)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and status(agent)["greedy"]["state"] != "FAILED":
                infer_http(agent, "greedy")
        finally:
            done.set()
            thread.join()
        greedy = status(agent)["greedy"]
        assert greedy["state"] == "FAILED", greedy
        assert codes and set(codes) == {200}, codes
        assert infer_http(agent, "ok")[0] == 200
        assert status(agent)["ok"]["state"] == "READY"
        assert agent.process.poll() is None
        if memory["runner_memory_limits"].startswith("cgroup"):
            limit = 48 * 1024 * 1024 + 2 * 8 * 1024 * 1024  # its model's, and its rings
            assert f"exceeding its memory limit ({limit} bytes)" in greedy["reason"], greedy
            metrics = agent.http_get("/metrics")[1].decode()
            assert 'edgeplex_runner_oom_kills_total{runner="dedicated-greedy"} 2.0' in metrics
        print(f"limit via {memory['runner_memory_limits']}: {greedy['reason']}")
    finally:
        assert agent.stop() == 0, agent.log()
