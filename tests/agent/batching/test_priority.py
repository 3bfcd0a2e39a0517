"""Triton's priority levels end to end: a request's `priority` parameter, over
HTTP and gRPC, orders the model's queue; a bad one is refused, naming it."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import start_agent
from tests.support.oip import inputs_for

pytestmark = pytest.mark.slow

SIZE = 1280  # 24 products of 1280x1280 matrices a request: about a quarter of a second
CONFIG = """name: "slow"
max_batch_size: 1
dynamic_batching { priority_levels: 2 default_priority_level: 2 }
"""


def test_a_higher_priority_request_overtakes_the_queue(tmp_path):
    """One request runs (about a quarter of a second of matrix products); three of the default
    level 2 queue behind it, then one asking for level 1: it runs next, before the
    three, and a priority the model has no level for takes the default."""
    demo.make_slow(tmp_path / "repo" / "slow", size=SIZE, depth=24)
    (tmp_path / "repo" / "slow" / "config.pbtxt").write_text(CONFIG)
    agent = start_agent(tmp_path / "repo", tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url, concurrency=8)
        inputs = [th.InferInput("input", [1, SIZE, SIZE], "FP32")]
        # 1/SIZE squared as a matrix is itself: no value grows, none underflows.
        inputs[0].set_data_from_numpy(np.full((1, SIZE, SIZE), 1 / SIZE, np.float32))
        client.infer("slow", inputs)  # loaded
        done: dict[str, float] = {}

        def call(name: str, priority: int) -> None:
            local = th.InferenceServerClient(agent.http_url)
            local.infer("slow", inputs, priority=priority)
            done[name] = time.monotonic()

        threads: list[threading.Thread] = []

        def send(name: str, priority: int) -> None:
            threads.append(threading.Thread(target=call, args=(name, priority)))
            threads[-1].start()

        send("busy", 0)
        time.sleep(0.05)  # running: the rest queue behind it
        # Each queued before the next is sent (threads alone do not keep an order
        # on a loaded machine), then "high" behind the three.
        for depth, (name, priority) in enumerate([("low1", 0), ("low2", 9), ("low3", 2)], 1):
            send(name, priority)
            _until_queued(agent, depth)
        send("high", 1)
        for thread in threads:
            thread.join(60)
        assert sorted(done, key=done.get) == ["busy", "high", "low1", "low2", "low3"], done
    finally:
        assert agent.stop() == 0, agent.log()


def _until_queued(agent, depth: int) -> None:
    """Polled often: `busy` runs for a few tenths of a second only."""
    wanted = f'edgeplex_agent_queue_depth_requests{{model="slow"}} {depth:.1f}'
    deadline = time.monotonic() + 10
    while wanted not in agent.http_get("/metrics")[1].decode():
        assert time.monotonic() < deadline, f"never {depth} queued"
        time.sleep(0.01)


def test_the_priority_parameter_over_both_doors_and_a_bad_one_refused(tmp_path):
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    (tmp_path / "repo" / "add_sub" / "config.pbtxt").write_text(
        'name: "add_sub"\nmax_batch_size: 8\n'
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 }\n"
    )
    agent = start_agent(tmp_path / "repo", tmp_path)
    try:
        x = np.ones((1, 16), np.float32)
        grpc_client = tg.InferenceServerClient(agent.grpc_url)
        feeds = inputs_for({"INPUT0": x, "INPUT1": x})
        result = grpc_client.infer("add_sub", feeds, priority=2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
        assert grpc_client.get_model_config("add_sub").config.dynamic_batching.priority_levels == 2
        body = (
            b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
            + str([1.0] * 16).encode()
            + b'}], "parameters": {"priority": -1}}'
        )
        url = f"http://{agent.http_url}/v2/models/add_sub/infer"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, body), timeout=10)
        text = refused.value.read()
        assert refused.value.code == 400, text
        assert b"'priority' must be a non-negative integer" in text, text
        http_client = th.InferenceServerClient(agent.http_url)
        http_feeds = [th.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in http_feeds:
            tensor.set_data_from_numpy(x)
        assert http_client.infer("add_sub", http_feeds, priority=1).as_numpy("OUTPUT1").sum() == 0
        request = pb.ModelInferRequest(model_name="add_sub")
        request.parameters["priority"].string_param = "high"  # tritonclient sends a number
        with grpc.insecure_channel(agent.grpc_url) as channel, pytest.raises(grpc.RpcError) as bad:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'priority' must be a non-negative integer" in bad.value.details()
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_priority_level_has_its_own_queue_size_and_timeout(tmp_path):
    """Triton's priority_queue_policy: behind a backlog of level 1, a level 2 request
    times out at its level's 0.6 s (the model's own timeout is 30 s), and a second
    one is refused while the first waits, level 2 holding one; the config says so,
    and a level the model does not have fails it."""
    repo = tmp_path / "repo"
    demo.make_slow(repo / "slow", size=SIZE, depth=24)
    policy = (
        "priority_queue_policy { key: 2 value: { max_queue_size: 1 "
        "default_timeout_microseconds: 600000 } } }"
    )
    (repo / "slow" / "config.pbtxt").write_text(CONFIG.replace("2 }", f"2 {policy}"))
    demo.make_add_sub(repo / "no_such_level")
    (repo / "no_such_level" / "config.pbtxt").write_text(
        "max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 3 value: { max_queue_size: 1 } } }\n"
    )
    agent = start_agent(repo, tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url)
        config = client.get_model_config("slow")["dynamic_batching"]
        assert config["priority_queue_policy"] == {
            "2": {"max_queue_size": 1, "default_timeout_microseconds": 600_000,
                  "timeout_action": "REJECT", "allow_timeout_override": False}
        }  # fmt: skip
        status = {m["name"]: m for m in client.get_model_repository_index()}
        why = "priority_queue_policy: level 3 is not one of the model's priority levels (1 to 2)"
        assert why in status["no_such_level"]["reason"], status["no_such_level"]
        inputs = [th.InferInput("input", [1, SIZE, SIZE], "FP32")]
        inputs[0].set_data_from_numpy(np.full((1, SIZE, SIZE), 1 / SIZE, np.float32))
        client.infer("slow", inputs, priority=1)  # loaded (level 2 would allow it 0.6 s)
        errors: dict[str, str] = {}

        def call(name: str, priority: int) -> None:
            own = th.InferenceServerClient(agent.http_url)  # closed in the thread that made it
            try:
                own.infer("slow", inputs, priority=priority)
            except InferenceServerException as exc:
                errors[name] = str(exc)
            finally:
                own.close()

        threads = [threading.Thread(target=call, args=(f"high{i}", 1)) for i in range(5)]
        for thread in threads:  # about a second and a quarter of level 1 work
            thread.start()
        _until_queued(agent, 4)
        threads.append(threading.Thread(target=call, args=("low", 2)))
        threads[-1].start()
        _until_queued(agent, 5)
        call("refused", 2)
        for thread in threads:
            thread.join(60)
        assert "the queue of priority level 2 is full (1 requests waiting)" in errors["refused"]
        assert "timed out" in errors["low"], errors
        assert not any(name.startswith("high") for name in errors), errors
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_delay_policy_serves_queued_requests_past_their_timeout(tmp_path):
    """Triton's `timeout_action: DELAY` with `allow_timeout_override: false`: requests
    that wait behind a busy instance well past the model's 0.1 s are served, not
    failed, one of them asking for a 1 ms `timeout` that the model does not let
    shorten its own; a gRPC deadline still ends a call. The config says so."""
    repo = tmp_path / "repo"
    demo.make_slow(repo / "slow", size=SIZE, depth=24)
    policy = (
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 "
        "allow_timeout_override: false }"
    )
    (repo / "slow" / "config.pbtxt").write_text(
        f'name: "slow"\nmax_batch_size: 1\ndynamic_batching {{ {policy} }}\n'
    )
    agent = start_agent(repo, tmp_path)
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        queue_policy = client.get_model_config("slow").config.dynamic_batching.default_queue_policy
        assert queue_policy.timeout_action == queue_policy.DELAY
        assert not queue_policy.allow_timeout_override
        inputs = [tg.InferInput("input", [1, SIZE, SIZE], "FP32")]
        inputs[0].set_data_from_numpy(np.full((1, SIZE, SIZE), 1 / SIZE, np.float32))
        client.infer("slow", inputs)  # loaded
        errors: dict[str, str] = {}
        served: list[str] = []

        def call(name: str, **options: float) -> None:
            try:
                tg.InferenceServerClient(agent.grpc_url).infer("slow", inputs, **options)
                served.append(name)
            except InferenceServerException as exc:
                errors[name] = str(exc)

        calls = [("busy", {}), ("a", {}), ("b", {"timeout": 1000}), ("c", {})]
        threads = [threading.Thread(target=call, args=(n,), kwargs=o) for n, o in calls]
        for thread in threads:
            thread.start()
            time.sleep(0.02)
        _until_queued(agent, 3)
        # Each waits a quarter of a second or more per request ahead of it.
        gone = threading.Thread(target=call, args=("gone",), kwargs={"client_timeout": 0.3})
        gone.start()
        for thread in [*threads, gone]:
            thread.join(60)
        assert sorted(served) == ["a", "b", "busy", "c"], errors
        assert "DEADLINE_EXCEEDED" in errors["gone"], errors
    finally:
        assert agent.stop() == 0, agent.log()
