"""Stateful test models as Triton's sequence examples use them: tiny ONNX graphs
with their config.pbtxt (sequence_batching), for tests of the sequence batcher."""

from __future__ import annotations

import queue
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as tg
from onnx import TensorProto, helper, save

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


def model(directory: Path, nodes: list, inputs: list[str], outputs: list[str], config: str,  # type: ignore[no-untyped-def]
           initializers: list | None = None):  # fmt: skip
    def value(name: str):  # type: ignore[no-untyped-def]
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])

    graph = helper.make_graph(nodes, directory.name, [value(n) for n in inputs],
                              [value(n) for n in outputs], initializers or [])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (directory / "1").mkdir(parents=True)
    save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(config)


# The running sum again, with Triton's direct strategy: max_batch_size 2 on one
# instance is two sequence slots; config.yaml leaves room for two STARTs to wait.
TWO_SLOTS = (
    ACCUMULATE.replace('"accumulate"', '"two_slots"')
    .replace("max_batch_size: 8", "max_batch_size: 2")
    .replace("oldest { max_candidate_sequences: 4 }", "direct { }")
    .replace("500000", "1000000")
)


# The running sum from 100: the state's initial values are a file, as Triton reads it.
FROM_A_HUNDRED = ACCUMULATE.replace('"accumulate"', '"from_a_hundred"').replace(
    "dims: [ 1 ] } ]\n}",
    'dims: [ 1 ]\n    initial_state { name: "hundred" data_type: TYPE_INT32 dims: [ 1 ] '
    'data_file: "hundred" } } ]\n}',
)


def make_simple_sequence(directory: Path) -> None:
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]  # fmt: skip
    model(directory, nodes, ["INPUT", "START", "READY"], ["OUTPUT"], SIMPLE_SEQUENCE)


def running_sum(directory: Path, config: str) -> None:
    """OUTPUT = INPUT + ACC (the implicit state), ACC_OUT = OUTPUT, under `config`."""
    nodes = [helper.make_node("Add", ["INPUT", "ACC"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["ACC_OUT"])]  # fmt: skip
    model(directory, nodes, ["INPUT", "ACC"], ["OUTPUT", "ACC_OUT"], config)


def make_accumulate(directory: Path) -> None:
    running_sum(directory, ACCUMULATE)


def make_from_a_hundred(directory: Path) -> None:
    running_sum(directory, FROM_A_HUNDRED)
    (directory / "initial_state").mkdir()
    (directory / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())


def make_two_slots(directory: Path, backlog: int = 2, idle_us: int = 1_000_000) -> None:
    """Two sequence slots, room for `backlog` STARTs to wait (max_queue_size), and
    sequences idle out after `idle_us`."""
    config = TWO_SLOTS.replace('"two_slots"', f'"{directory.name}"').replace(
        "max_sequence_idle_microseconds: 1000000", f"max_sequence_idle_microseconds: {idle_us}"
    )
    running_sum(directory, config)
    (directory / "config.yaml").write_text(f"max_queue_size: {backlog}\n")


# An ensemble whose one step is the running sum: the request's sequence goes to it.
RUNNING_TOTAL = """
name: "running_total"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "accumulate" model_version: -1
  input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "TOTAL" } } ] }
"""


def make_running_total(directory: Path) -> None:
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(RUNNING_TOTAL)


def value_input(module: Any, value: int) -> Any:
    """The models' INPUT, [[value]] (module: tritonclient.grpc or .http)."""
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def open_stream(client: tg.InferenceServerClient) -> queue.Queue:
    """Start `client`'s gRPC stream; each answer arrives in the queue as (result, error)."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    return answers


def stream_value(client: tg.InferenceServerClient, model: str, value: int, sequence_id: Any,
                 start: bool = False, end: bool = False, **options: Any) -> None:  # fmt: skip
    """Send INPUT [[value]] of sequence `sequence_id` on `client`'s stream."""
    client.async_stream_infer(model, [value_input(tg, value)], sequence_id=sequence_id,
                              sequence_start=start, sequence_end=end, **options)  # fmt: skip
