"""Runner supervision: a SIGKILLed runner takes down only its own models, which
come back within 5 s, while models in other runners see zero failed requests."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from tests.conftest import start_agent
from tests.support.oip import inputs_for
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

FEEDS = {
    "add_sub_nobatch": {
        "INPUT0": np.ones((1, 16), np.float32),
        "INPUT1": np.ones((1, 16), np.float32),
    },
    "mlp_small": {"input": np.ones((2, 32), np.float32)},
    "mlp_dedicated": {"input": np.ones((2, 32), np.float32)},
}


@pytest.fixture
def crash_agent(model_repo, tmp_path):
    agent = start_agent(model_repo, tmp_path)
    yield agent
    assert agent.stop() == 0, agent.log()


def runner_pids(agent) -> dict[str, int]:
    _, body = agent.http_get("/edgeplex/v1/status")
    return {m["name"]: m["runner_pid"] for m in json.loads(body)}


class Load:
    """Closed-loop clients, one thread per model, counting outcomes per model."""

    def __init__(self, agent, models) -> None:
        self.agent = agent
        self.outcomes: dict[str, Counter[str]] = {m: Counter() for m in models}
        self.errors: dict[str, list[str]] = {m: [] for m in models}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(m,)) for m in models for _ in range(2)
        ]

    def _run(self, model: str) -> None:
        client = tg.InferenceServerClient(self.agent.grpc_url)
        while not self._stop.is_set():
            try:
                client.infer(model, inputs_for(FEEDS[model]), client_timeout=30)
                self.outcomes[model]["ok"] += 1
            except InferenceServerException as exc:
                self.outcomes[model]["error"] += 1
                self.errors[model].append(f"{exc.status()}: {exc.message()}")

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def wait_ready(client, model: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if client.is_model_ready(model):
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{model} not ready within {timeout} s")


@pytest.mark.parametrize(
    "victim,survivors",
    [
        ("mlp_dedicated", ["add_sub_nobatch", "mlp_small"]),
        ("add_sub_nobatch", ["mlp_dedicated"]),
    ],
)
def test_sigkill_runner_under_load(crash_agent, victim, survivors):
    client = tg.InferenceServerClient(crash_agent.grpc_url)
    pids = runner_pids(crash_agent)
    victim_pid = pids[victim]
    assert all(pids[s] != victim_pid for s in survivors)
    with Load(crash_agent, [victim, *survivors]) as load:
        wait_until(lambda: all(load.outcomes[m]["ok"] for m in load.outcomes), what="load")
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(0.05)
        recovery = wait_ready(client, victim, timeout=5.0)
        assert time.monotonic() - killed_at < 5.0
        served = {m: load.outcomes[m]["ok"] for m in survivors}
        wait_until(  # the survivors go on serving after the victim is back
            lambda: all(load.outcomes[m]["ok"] > served[m] for m in survivors), what="survivors"
        )
    for model in survivors:
        assert load.outcomes[model]["error"] == 0, load.errors[model][:3]
        assert load.outcomes[model]["ok"] > 0
    # Requests caught in the crash were re-dispatched once, after the reload.
    assert load.outcomes[victim]["error"] == 0, load.errors[victim][:3]
    assert runner_pids(crash_agent)[victim] not in (victim_pid, None)
    _, metrics = crash_agent.http_get("/metrics")
    assert "edgeplex_runner_restarts_total" in metrics.decode()
    print(f"{victim}: ready again {recovery:.2f} s after SIGKILL; outcomes {load.outcomes}")
