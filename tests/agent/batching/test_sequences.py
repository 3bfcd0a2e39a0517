"""Stateful models as Triton's sequence batcher serves them, through the stock
tritonclient: control inputs filled in, implicit state carried between a sequence's
requests over interleaved correlation ids, order kept, the idle timeout, and the
model held resident while a sequence lives."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto, helper, save
from tritonclient.utils import InferenceServerException

from tests.conftest import AgentProcess, start_agent
from tests.support.agent import status

pytestmark = pytest.mark.slow

# OUTPUT = INPUT + START (as Triton's simple_sequence example model answers).
SIMPLE_SEQUENCE = """
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 500000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
"""

# OUTPUT = INPUT + ACC (the implicit state), ACC_OUT = OUTPUT: a running sum.
ACCUMULATE = """
name: "accumulate"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  oldest { max_candidate_sequences: 4 }
  max_sequence_idle_microseconds: 500000
  state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def _model(directory: Path, nodes: list, inputs: list[str], outputs: list[str], config: str):  # type: ignore[no-untyped-def]
    def value(name: str):  # type: ignore[no-untyped-def]
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])

    graph = helper.make_graph(nodes, directory.name, [value(n) for n in inputs],
                              [value(n) for n in outputs])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (directory / "1").mkdir(parents=True)
    save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(config)


def make_simple_sequence(directory: Path) -> None:
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]  # fmt: skip
    _model(directory, nodes, ["INPUT", "START", "READY"], ["OUTPUT"], SIMPLE_SEQUENCE)


def make_accumulate(directory: Path) -> None:
    nodes = [helper.make_node("Add", ["INPUT", "ACC"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"])]  # fmt: skip
    _model(directory, nodes, ["INPUT", "ACC"], ["OUTPUT", "ACC_OUT"], ACCUMULATE)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("sequences")
    make_simple_sequence(root / "repo" / "simple_sequence")
    make_accumulate(root / "repo" / "accumulate")
    process = start_agent(root / "repo", root)
    yield process
    assert process.stop() == 0, process.log()


def _send(client, model: str, value: int, sequence_id, start: bool = False, end: bool = False):  # type: ignore[no-untyped-def]
    module = tg if isinstance(client, tg.InferenceServerClient) else th
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start,
                          sequence_end=end)  # fmt: skip
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


def test_a_stream_keeps_each_sequences_order(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    expected = {}
    for sid, first in ((7, 1000), (8, -1000)):  # sums that never meet
        tensor = tg.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[first]], dtype=np.int32))
        client.async_stream_infer("accumulate", [tensor], sequence_id=sid, sequence_start=True)
        expected[sid] = [first]
    for step in range(1, 11):
        for sid in (7, 8):
            tensor = tg.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[step]], dtype=np.int32))
            client.async_stream_infer("accumulate", [tensor], sequence_id=sid,
                                      sequence_end=step == 10)  # fmt: skip
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


def test_an_idle_sequence_is_dropped_and_a_live_one_holds_its_model(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    assert _send(client, "accumulate", 5, 42, start=True) == 5
    assert status(agent)["accumulate"]["leases"] >= 1  # held while the sequence lives
    time.sleep(1.0)  # past max_sequence_idle_microseconds (0.5 s)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, "accumulate", 1, 42)
    assert status(agent)["accumulate"]["leases"] == 0


def test_silero_vad_streams_its_state_in_the_agent(tmp_path: Path) -> None:
    """The demo's silero-vad as a sequence: each request a 32 ms chunk, the recurrent
    state carried by the agent; the probabilities equal ONNX Runtime's with the state
    chained by hand."""
    import onnxruntime as ort

    from edgeplex.agent.catalog import demo
    from tests.conftest import CACHE

    path = demo.make_silero_stream(tmp_path / "repo" / "silero_vad_stream", cache=CACHE)
    rng = np.random.default_rng(1)
    audio = np.concatenate([np.zeros(512 * 4), rng.normal(0, 0.3, 512 * 6)]).astype(np.float32)
    chunks = audio.reshape(-1, 1, 512)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    state, expected = np.zeros((2, 1, 128), np.float32), []
    for chunk in chunks:
        feed = {"input": chunk, "state": state, "sr": np.array(16000)}
        output, state = session.run(None, feed)
        expected.append(float(output[0][0]))
    agent = start_agent(tmp_path / "repo", tmp_path)
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        got = []
        for i, chunk in enumerate(chunks):
            tensors = [tg.InferInput("input", [1, 512], "FP32"), tg.InferInput("sr", [], "INT64")]
            tensors[0].set_data_from_numpy(chunk)
            tensors[1].set_data_from_numpy(np.array(16000, dtype=np.int64))
            last = i == len(chunks) - 1
            result = client.infer(
                "silero_vad_stream", tensors, sequence_id="mic-1", sequence_start=i == 0,
                sequence_end=last,
            )  # fmt: skip
            got.append(float(result.as_numpy("output")[0][0]))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    finally:
        assert agent.stop() == 0, agent.log()
