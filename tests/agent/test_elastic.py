"""Elastic instances: a hot model gets more, an idle one goes back."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as tg

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent
from tests.support.agent import status
from tests.support.oip import inputs_for

pytestmark = pytest.mark.slow


def test_instances_follow_the_queue(tmp_path):
    repo = tmp_path / "repo"
    demo.make_slow(
        repo / "hot",
        size=256,
        depth=16,
        config="max_batch_size: 0\nmax_instances: 3\nscale_down_idle_s: 0.5\n",
    )
    agent = start_agent(repo, tmp_path)
    try:
        assert status(agent)["hot"]["instances"] == 1
        stop = threading.Event()
        feeds = inputs_for({"input": np.ones((1, 256, 256), np.float32)})

        def client() -> None:
            local = tg.InferenceServerClient(agent.grpc_url)
            while not stop.is_set():
                local.infer("hot", feeds)

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        peak = 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and peak < 3:
            peak = max(peak, status(agent)["hot"]["instances"])
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
        assert peak == 3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and status(agent)["hot"]["instances"] != 1:
            time.sleep(0.1)
        assert status(agent)["hot"]["instances"] == 1
        _, metrics = agent.http_get("/metrics")
        assert 'edgeplex_agent_model_instances{model="hot"}' in metrics.decode()
    finally:
        assert agent.stop() == 0, agent.log()
