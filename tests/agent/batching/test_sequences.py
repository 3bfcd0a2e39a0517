"""Stateful models as Triton's sequence batcher serves them, through the stock
tritonclient: control inputs filled in, implicit state carried between a sequence's
requests over interleaved correlation ids, order kept, the idle timeout, and the
model held resident while a sequence lives."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.conftest import AgentProcess, start_agent
from tests.support.agent import status
from tests.support.sequences import (
    ACCUMULATE,
    make_accumulate,
    make_from_a_hundred,
    make_running_total,
    make_simple_sequence,
    make_two_slots,
    model,
    open_stream,
    stream_value,
    value_input,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("sequences")
    make_simple_sequence(root / "repo" / "simple_sequence")
    make_accumulate(root / "repo" / "accumulate")
    make_two_slots(root / "repo" / "two_slots")
    make_two_slots(root / "repo" / "two_slots_deep", backlog=32, idle_us=30_000_000)
    make_from_a_hundred(root / "repo" / "from_a_hundred")
    make_running_total(root / "repo" / "running_total")
    process = start_agent(root / "repo", root)
    yield process
    assert process.stop() == 0, process.log()


def _send(client, model: str, value: int, sequence_id, start: bool = False, end: bool = False):  # type: ignore[no-untyped-def]
    module = tg if isinstance(client, tg.InferenceServerClient) else th
    result = client.infer(model, [value_input(module, value)], sequence_id=sequence_id,
                          sequence_start=start, sequence_end=end)  # fmt: skip
    return int(result.as_numpy("OUTPUT")[0][0])


def test_control_inputs_are_filled_in_as_triton_does(agent: AgentProcess) -> None:
    for client in (
        tg.InferenceServerClient(agent.grpc_url),
        th.InferenceServerClient(agent.http_url),
    ):
        assert _send(client, "simple_sequence", 0, 1000, start=True) == 1
        assert _send(client, "simple_sequence", 100, "a-string-id", start=True) == 101
        assert [_send(client, "simple_sequence", v, 1000) for v in (11, 7)] == [11, 7]
        assert _send(client, "simple_sequence", 5, 1000, end=True) == 5
        assert _send(client, "simple_sequence", 3, "a-string-id", end=True) == 3
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            _send(client, "simple_sequence", 1, 1000)  # ended: a new one must START
        with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation"):
            _send(client, "simple_sequence", 1, 0)


def test_implicit_state_is_carried_per_sequence_over_interleaved_ids(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    sums = {1: 0, 2: 100, 3: -50}
    for sid, first in sums.items():
        assert _send(client, "accumulate", first, sid, start=True) == first
    rng = np.random.default_rng(0)
    for _ in range(30):  # interleaved, each sequence its own running sum
        sid = int(rng.integers(1, 4))
        value = int(rng.integers(-10, 10))
        sums[sid] += value
        assert _send(client, "accumulate", value, sid) == sums[sid]
    assert _send(client, "accumulate", 1, 2, start=True) == 1  # a START begins anew
    # The state output is the agent's, never the client's.
    tensor = tg.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    result = client.infer("accumulate", [tensor], sequence_id=1, sequence_end=True)
    assert (
        result.as_numpy("ACC_OUT") is None and int(result.as_numpy("OUTPUT")[0][0]) == sums[1] + 1
    )


def test_a_state_starts_from_its_initial_state_file(agent: AgentProcess) -> None:
    client = th.InferenceServerClient(agent.http_url)
    assert _send(client, "from_a_hundred", 5, 1, start=True) == 105
    assert _send(client, "from_a_hundred", 1, 2, start=True) == 101  # each its own
    assert _send(client, "from_a_hundred", 5, 1) == 110
    assert _send(client, "from_a_hundred", 0, 1, start=True) == 100  # a START: anew
    for sid in (1, 2):
        _send(client, "from_a_hundred", 0, sid, end=True)


def test_an_ensemble_passes_its_sequence_to_a_stateful_step(agent: AgentProcess) -> None:
    """As Triton's ensemble scheduler does: the request's sequence id and flags go to
    each step, so a stateful step keeps its state per sequence of the ensemble."""
    client = tg.InferenceServerClient(agent.grpc_url)

    def total(value: int, sid: int, start: bool = False, end: bool = False) -> int:
        tensor = tg.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer("running_total", [tensor], sequence_id=sid, sequence_start=start,
                              sequence_end=end)  # fmt: skip
        return int(result.as_numpy("TOTAL")[0][0])

    assert [total(5, 501, start=True), total(7, 502, start=True)] == [5, 7]
    assert [total(1, 501), total(1, 502), total(2, 501, end=True)] == [6, 8, 8]
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        total(1, 501)  # ended
    assert total(3, 502, end=True) == 11


def test_a_stream_keeps_each_sequences_order(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    answers = open_stream(client)
    expected = {}
    for sid, first in ((7, 1000), (8, -1000)):  # sums that never meet
        stream_value(client, "accumulate", first, sid, start=True)
        expected[sid] = [first]
    for step in range(1, 11):
        for sid in (7, 8):
            stream_value(client, "accumulate", step, sid, end=step == 10)
            expected[sid].append(expected[sid][-1] + step)
    got: list[int] = []
    for _ in range(22):
        result, error = answers.get(timeout=30)
        assert error is None, error
        got.append(int(result.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    merged = sorted(expected[7] + expected[8])
    assert sorted(got) == merged
    for sid in (7, 8):  # each sequence's answers in its order
        assert [v for v in got if v in expected[sid]] == expected[sid]


def test_an_idle_sequence_is_dropped(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    assert _send(client, "accumulate", 5, 42, start=True) == 5
    assert status(agent)["accumulate"]["sequences"]["live"] >= 1
    time.sleep(1.0)  # past max_sequence_idle_microseconds (0.5 s)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, "accumulate", 1, 42)
    assert status(agent)["accumulate"]["sequences"]["live"] == 0


def test_a_live_sequence_keeps_its_model_resident(tmp_path: Path) -> None:
    """A device budget with room for one of two stateful models: while a sequence of
    the first lives, the second's load waits (its request times out) instead of
    evicting it, and the sequence goes on with its state; once the sequence ends,
    the second loads in its place."""
    weights = numpy_helper.from_array(np.ones((1, 1 << 20), np.float32), "W")  # 4 MiB
    for name in ("first", "second"):
        config = ACCUMULATE.replace('"accumulate"', f'"{name}"').replace("500000", "20000000")
        nodes = [  # the running sum, plus a product with W that is always 0
            helper.make_node("Cast", ["INPUT"], ["x"], to=TensorProto.FLOAT),
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("ReduceMin", ["xw"], ["low"], axes=[1], keepdims=1),
            helper.make_node("Sub", ["low", "low"], ["zero"]),
            helper.make_node("Cast", ["zero"], ["nothing"], to=TensorProto.INT32),
            helper.make_node("Add", ["INPUT", "ACC"], ["sum"]),
            helper.make_node("Add", ["sum", "nothing"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"]),
        ]
        model(tmp_path / "repo" / name, nodes, ["INPUT", "ACC"], ["OUTPUT", "ACC_OUT"], config,
               [weights])  # fmt: skip
    agent = start_agent(tmp_path / "repo", tmp_path, env={
        "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": "7MiB",  # room for one model, not two
        "EDGEPLEX_AGENT_LOAD_MODELS_AT_START": "false",
    })  # fmt: skip
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        assert _send(client, "first", 5, 1, start=True) == 5
        tensor = tg.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="waiting for the model to load"):
            client.infer("second", [tensor], sequence_id=1, sequence_start=True, timeout=500_000)
        assert status(agent)["first"]["state"] == "READY"
        assert _send(client, "first", 2, 1, end=True) == 7  # its state went on
        assert _send(client, "second", 3, 1, start=True, end=True) == 3
        models = status(agent)
        assert models["second"]["state"] == "READY" and models["first"]["state"] != "READY"
    finally:
        assert agent.stop() == 0, agent.log()


def _slots(agent: AgentProcess) -> dict:
    return status(agent)["two_slots"]["sequences"]


def test_sequences_beyond_the_slots_wait_for_one_in_a_bounded_backlog(agent: AgentProcess) -> None:
    """Two slots (direct, max_batch_size 2): a third and a fourth START wait until a
    sequence ends and then begin, each with its own state; a fifth finds the
    backlog full (its max_queue_size, 2) and is refused at once; a START still
    waiting at its deadline fails, and its sequence never began; an idle sequence
    gives its slot back."""
    client = tg.InferenceServerClient(agent.grpc_url)
    assert _send(client, "two_slots", 1, "a", start=True) == 1
    assert _send(client, "two_slots", 2, "b", start=True) == 2
    assert _slots(agent) == {"live": 2, "slots": 2, "waiting": 0}
    with ThreadPoolExecutor(2) as pool:
        others = [tg.InferenceServerClient(agent.grpc_url) for _ in range(2)]
        third = pool.submit(_send, others[0], "two_slots", 10, "c", start=True)
        wait_until(lambda: _slots(agent)["waiting"] == 1, timeout=10)
        fourth = pool.submit(_send, others[1], "two_slots", 20, "d", start=True)
        wait_until(lambda: _slots(agent)["waiting"] == 2, timeout=10)
        with pytest.raises(InferenceServerException, match="every sequence slot is taken") as full:
            _send(client, "two_slots", 1, "x", start=True)
        assert full.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'nv_inference_pending_request_count{model="two_slots",version="1"} 2' in metrics
        assert 'edgeplex_agent_sequences{model="two_slots",state="live"} 2.0' in metrics
        assert 'edgeplex_agent_sequences{model="two_slots",state="waiting"} 2.0' in metrics
        assert not third.done() and not fourth.done()
        assert _send(client, "two_slots", 5, "a", end=True) == 6  # a ends: c, the oldest, begins
        assert third.result(timeout=10) == 10 and not fourth.done()
        assert _send(client, "two_slots", 5, "b", end=True) == 7
        assert fourth.result(timeout=10) == 20
    assert _send(client, "two_slots", 1, "d", end=True) == 21
    assert _send(client, "two_slots", 1, "c") == 11  # c's own running sum
    assert _send(client, "two_slots", 3, "g", start=True) == 3
    assert _slots(agent) == {"live": 2, "slots": 2, "waiting": 0}
    tensor = tg.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="timed out waiting for a sequence slot"):
        client.infer("two_slots", [tensor], sequence_id="e", sequence_start=True, timeout=300_000)
    assert 0.25 < time.monotonic() - started < 5
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, "two_slots", 1, "e")  # it never began
    # c and g idle past max_sequence_idle_microseconds (1 s): their slots are free.
    wait_until(lambda: _slots(agent)["live"] == 0, timeout=10)
    assert _send(client, "two_slots", 7, "f", start=True, end=True) == 7


def test_a_stream_serves_its_requests_side_by_side(agent: AgentProcess) -> None:
    """On one gRPC stream, as Triton serves it: a START that waits for a sequence slot
    does not hold up the END behind it that frees one, and the answers come back in
    the order of their requests."""
    client = tg.InferenceServerClient(agent.grpc_url)
    answers = open_stream(client)
    sent = [("s1", 1, True, False), ("s2", 2, True, False), ("s3", 3, True, False),
            ("s1", 10, False, True), ("s2", 20, False, True), ("s3", 30, False, True)]  # fmt: skip
    for n, (sid, value, start, end) in enumerate(sent):
        stream_value(client, "two_slots", value, sid, start, end, request_id=f"{sid}-{n}",
                     timeout=10_000_000)  # fmt: skip
    got = []
    for _ in sent:
        result, error = answers.get(timeout=15)
        assert error is None, error
        got.append((result.get_response().id, int(result.as_numpy("OUTPUT")[0][0])))
    client.stop_stream()
    assert got == [("s1-0", 1), ("s2-1", 2), ("s3-2", 3), ("s1-3", 11), ("s2-4", 22), ("s3-5", 33)]
    assert _slots(agent) == {"live": 0, "slots": 2, "waiting": 0}


def test_many_starts_waiting_on_a_stream_do_not_stop_it_reading(agent: AgentProcess) -> None:
    """Eighteen STARTs wait for two slots on one stream, more than a stream's queue of
    messages (16): the stream still reads the ENDs behind them, whose slots go to the
    two oldest; the rest fail at their deadline. Answers keep request order."""
    client = tg.InferenceServerClient(agent.grpc_url)
    answers = open_stream(client)
    sent = [("s1", True, False), ("s2", True, False)]
    sent += [(f"w{i}", True, False) for i in range(18)]
    sent += [("s1", False, True), ("s2", False, True)]
    for n, (sid, start, end) in enumerate(sent):
        stream_value(client, "two_slots_deep", 1, sid, start, end, request_id=str(n),
                     timeout=3_000_000)  # fmt: skip
    got = []
    for _ in sent:
        _, error = answers.get(timeout=20)
        got.append("ok" if error is None else error.message())
    client.stop_stream()
    assert got[:4] == ["ok"] * 4, got  # s1, s2, and w0, w1 once s1 and s2 end
    assert all("waiting for a sequence slot" in g for g in got[4:20]), got
    assert got[20:] == ["ok", "ok"], got


def test_a_cancelled_stream_gives_up_its_waiting_start(agent: AgentProcess) -> None:
    """A stream cancelled by its client while one of its STARTs waits for a slot: the
    START leaves the backlog, and the sequences the stream began idle out as any."""
    client = tg.InferenceServerClient(agent.grpc_url)
    answers = open_stream(client)
    for sid in ("k1", "k2", "k3"):  # k3 waits: k1 and k2 take the slots
        stream_value(client, "two_slots", 1, sid, start=True, request_id=sid)
    assert all(answers.get(timeout=10)[1] is None for _ in range(2))
    wait_until(lambda: _slots(agent)["waiting"] == 1, timeout=10)
    client.stop_stream(cancel_requests=True)
    wait_until(lambda: _slots(agent)["waiting"] == 0, timeout=10)
    wait_until(lambda: _slots(agent)["live"] == 0, timeout=10)  # k1 and k2 idle out (1 s)
    assert _send(client, "two_slots", 4, "k3", start=True, end=True) == 4


def test_silero_vad_streams_its_state_in_the_agent(tmp_path: Path) -> None:
    """The demo's silero-vad as a sequence: each request a 32 ms chunk, the recurrent
    state carried by the agent, two microphones interleaved (the model does not
    batch; its candidate sequences let both live at once); each stream's
    probabilities equal ONNX Runtime's with its state chained by hand."""
    import onnxruntime as ort

    from edgeplex.agent.catalog import demo
    from tests.conftest import CACHE

    path = demo.make_silero_stream(tmp_path / "repo" / "silero_vad_stream", cache=CACHE)
    rng = np.random.default_rng(1)
    streams = {
        "mic-1": np.concatenate([np.zeros(512 * 4), rng.normal(0, 0.3, 512 * 6)]),
        "mic-2": np.concatenate([rng.normal(0, 0.3, 512 * 5), np.zeros(512 * 5)]),
    }
    chunks = {mic: audio.astype(np.float32).reshape(-1, 1, 512) for mic, audio in streams.items()}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected: dict[str, list[float]] = {}
    for mic, pieces in chunks.items():
        state, expected[mic] = np.zeros((2, 1, 128), np.float32), []
        for chunk in pieces:
            output, state = session.run(
                None, {"input": chunk, "state": state, "sr": np.array(16000)}
            )
            expected[mic].append(float(output[0][0]))
    agent = start_agent(tmp_path / "repo", tmp_path)
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        got: dict[str, list[float]] = {mic: [] for mic in chunks}
        for i in range(10):
            for mic, pieces in chunks.items():
                tensors = [tg.InferInput("input", [1, 512], "FP32"),
                           tg.InferInput("sr", [], "INT64")]  # fmt: skip
                tensors[0].set_data_from_numpy(pieces[i])
                tensors[1].set_data_from_numpy(np.array(16000, dtype=np.int64))
                result = client.infer(
                    "silero_vad_stream", tensors, sequence_id=mic, sequence_start=i == 0,
                    sequence_end=i == 9, timeout=5_000_000,
                )  # fmt: skip
                got[mic].append(float(result.as_numpy("output")[0][0]))
        for mic in chunks:
            np.testing.assert_allclose(got[mic], expected[mic], rtol=1e-4, atol=1e-5)
        assert got["mic-1"] != got["mic-2"]
    finally:
        assert agent.stop() == 0, agent.log()
