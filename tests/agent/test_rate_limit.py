"""Triton's rate limiter on a real agent: config.pbtxt's instance_group
`rate_limiter` read, two models sharing one resource served by 8 callers that
never pause, every request answered, batches held back for the resource; a model
asking for more than the agent's pool fails with the reason while the others
serve."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.triton_config import read_triton_config
from tests.conftest import ADMIN_TOKEN, start_agent

pytestmark = pytest.mark.slow

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [
  {{
    count: 2
    kind: KIND_CPU
    rate_limiter {{
      resources [ {{ name: "R" count: {count} }}, {{ name: "G" global: true count: 1 }} ]
      priority: {priority}
    }}
  }}
]
"""


def write(repo: Path, name: str, count: int = 1, priority: int = 1) -> Path:
    demo.make_mlp(repo / name, width=256, layers=4, seed=len(name), in_width=32)
    path = repo / name / "config.pbtxt"
    path.write_text(CONFIG.format(name=name, count=count, priority=priority))
    return path


def test_instance_groups_rate_limiters_read_as_triton_writes_them(tmp_path: Path) -> None:
    path = write(tmp_path, "m", count=3, priority=0)
    config = read_triton_config(path, "m")
    assert config.warnings == []
    assert config.settings["rate_limit_resources"] == {"R": 3, "G": 1}
    assert config.settings["rate_limit_priority"] == 1  # 0, unset, counts as 1
    two_groups = path.read_text().replace(
        "instance_group [", "instance_group [ { count: 1 kind: KIND_CPU }, ", 1
    )
    path.write_text(two_groups)
    config = read_triton_config(path, "m")
    assert config.settings["instance_count"] == 3
    assert any("different rate limiters are served as one" in w for w in config.warnings)
    path.write_text(path.read_text().replace('name: "R" count: 3', 'name: "R" count: 0'))
    with pytest.raises(ValueError, match="a resource needs a name and a count of at least 1"):
        read_triton_config(path, "m")


def test_models_sharing_a_resource_take_turns_and_answer_every_request(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write(repo, "first")
    write(repo, "second", priority=2)
    write(repo, "greedy", count=2)  # more R than the agent's pool holds
    env = {
        "EDGEPLEX_AGENT_RATE_LIMIT": "execution_count",
        "EDGEPLEX_AGENT_RATE_LIMIT_RESOURCES": '{"R": 1}',
    }
    agent = start_agent(repo, tmp_path, env=env)
    try:
        client = th.InferenceServerClient(agent.http_url)
        assert client.is_model_ready("first") and client.is_model_ready("second")
        assert not client.is_model_ready("greedy")
        with pytest.raises(InferenceServerException, match=r"2 of resource 'R'.* has 1"):
            client.load_model("greedy", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        echoed = client.get_model_config("second")["instance_group"][0]["rate_limiter"]
        assert echoed == {
            "resources": [{"name": "G", "count": 1}, {"name": "R", "count": 1}],
            "priority": 2,
        }

        x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 32)
        expected = {}
        for name in ("first", "second"):
            one = th.InferInput("input", [1, 32], "FP32")
            one.set_data_from_numpy(x)
            expected[name] = client.infer(name, [one]).as_numpy("output")
        outcomes: list[str] = []
        stop = time.monotonic() + 1.5

        def caller(name: str) -> None:  # closed loop: one request in flight, no pause
            own = th.InferenceServerClient(agent.http_url)
            item = th.InferInput("input", [1, 32], "FP32")
            item.set_data_from_numpy(x)
            while time.monotonic() < stop:
                try:
                    out = own.infer(name, [item]).as_numpy("output")
                    ok = np.allclose(out, expected[name], atol=1e-5)
                    outcomes.append("ok" if ok else f"{name}: wrong answer")
                except InferenceServerException as exc:
                    outcomes.append(f"{name}: {exc}")
            own.close()

        threads = [threading.Thread(target=caller, args=(n,)) for n in ["first", "second"] * 4]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes and set(outcomes) == {"ok"}, sorted(set(outcomes))[:5]
        metrics = agent.http_get("/metrics")[1].decode()
        waits = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("edgeplex_agent_rate_limiter_waits_total{")
        )
        assert waits > 0, "no batch waited for the shared resource"
        # At rest the pool is whole again; G's count is the most a model asks for.
        pool = json.loads(agent.http_get("/edgeplex/v1/memory")[1])["rate_limiter"]
        assert pool == {
            "resources": {
                "G": {"count": 1, "free": 1, "set": False},
                "R": {"count": 1, "free": 1, "set": True},
            },
            "waiting": 0,
        }
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()
