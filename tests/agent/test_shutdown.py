"""SIGTERM: readiness turns false at once, in-flight requests finish, exit 0."""

from __future__ import annotations

import queue
import signal
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import agent_command, start_agent
from tests.support.oip import inputs_for
from tests.support.sequences import make_two_slots, open_stream, stream_value

pytestmark = pytest.mark.slow


def test_sigterm_drains_in_flight_requests_and_exits_zero(model_repo, tmp_path):
    agent = start_agent(model_repo, tmp_path, env={"EDGEPLEX_AGENT_MAX_PAYLOAD_BYTES": "16MiB"})
    client = tg.InferenceServerClient(agent.grpc_url)
    outcome: dict[str, object] = {}

    def slow_request() -> None:
        try:
            result = tg.InferenceServerClient(agent.grpc_url).infer(
                "slow", inputs_for({"input": np.ones((8, 512, 512), np.float32)})
            )
            outcome["shape"] = result.as_numpy("output").shape
        except InferenceServerException as exc:
            outcome["error"] = f"{exc.status()}: {exc.message()}"

    thread = threading.Thread(target=slow_request)
    thread.start()
    # SIGTERM only once the agent has the request in hand.
    deadline = time.monotonic() + 10
    while (
        'edgeplex_agent_requests_total{model="slow"}' not in agent.http_get("/metrics")[1].decode()
    ):
        assert time.monotonic() < deadline, "the slow request never arrived"
        time.sleep(0.01)
    agent.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        status, _ = agent.http_get("/v2/health/ready")
        if status != 200:
            break
        time.sleep(0.01)
    assert status == 503, "readiness did not turn false after SIGTERM"
    with pytest.raises(InferenceServerException) as err:
        client.infer(
            "add_sub",
            inputs_for(
                {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
            ),
        )
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    thread.join(30)
    assert outcome.get("shape") == (8, 512, 512), outcome
    assert agent.process.wait(30) == 0, agent.log()


def test_a_port_in_use_or_a_missing_repository_is_a_clear_error(model_repo, tmp_path):
    import socket
    import subprocess

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for repo, grpc_port, needle in (
            (model_repo, port, "bind"),
            (tmp_path / "missing", 0, "repository"),
        ):
            proc = subprocess.run(
                agent_command(repo, grpc_port, 0),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 1
            assert "cannot start" in proc.stderr and needle in proc.stderr
            assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("door", ["native", "grpcio"])
def test_open_streams_and_a_start_waiting_for_a_slot_do_not_hold_the_shutdown(tmp_path, door):
    """gRPC streams left open (their clients send nothing more: an inference stream,
    a reflection stream as grpcurl keeps one) end when the agent shuts down, and a
    sequence START waiting for a slot fails UNAVAILABLE: the agent exits in well
    under the 30 s drain, with exit status 0, on either door."""
    make_two_slots(tmp_path / "repo" / "two_slots")  # two sequence slots
    agent = start_agent(tmp_path / "repo", tmp_path, env={"EDGEPLEX_AGENT_GRPC_SERVER": door})
    client = tg.InferenceServerClient(agent.grpc_url)
    answers = open_stream(client)
    for sid in ("a", "b", "c"):  # c waits: a and b hold the slots
        stream_value(client, "two_slots", 1, sid, start=True, request_id=sid)
    assert all(answers.get(timeout=10)[1] is None for _ in range(2))
    channel = grpc.insecure_channel(agent.grpc_url)
    asks: queue.Queue = queue.Queue()
    asks.put(reflection_pb2.ServerReflectionRequest(list_services=""))
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter(asks.get, None)
    )
    assert next(reflection).list_services_response.service  # open, and left open
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(10) == 0, agent.log()
    assert time.monotonic() - started < 5, agent.log()
    result, error = answers.get(timeout=5)
    assert result is None and "shutting down" in error.message(), error
    assert list(reflection) == []  # ended by the server, without an error
    asks.put(None)
    channel.close()
    client.stop_stream()
