"""Triton's `sequence_batching` in config.pbtxt, read as edgeplex serves it: the
control inputs the agent fills in for each request of a sequence (START, END,
READY, CORRID) and the implicit state it carries from one request's outputs to the
next one's inputs (agent/batching/sequences.py runs them).

A state starts as zeros, or as its `initial_state`'s `data_file`: raw values in
row-major order, read from the model's `initial_state/` folder when the model is
found, as Triton reads them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeplex.agent.catalog.model_files import read_model_file
from edgeplex.agent.oip.tensors import OIP_TO_NUMPY, from_triton_type, triton_type

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
INITIAL_STATE_DIR = "initial_state"  # a model's initial state files, as in Triton
MAX_INITIAL_STATE_BYTES = 64 << 20
# The fields of `sequence_batching`, and of each of its states, that sequence_spec
# reads (a strategy only by its name): triton_config.py names the rest in warnings.
SEQUENCE_FIELDS = frozenset(
    {"control_input", "state", "max_sequence_idle_microseconds", "direct", "oldest"}
)
STATE_FIELDS = frozenset({"input_name", "output_name", "data_type", "dims", "initial_state"})
# A flag control's datatype -> the field holding its false and true values, as typed.
_FALSE_TRUE: dict[str, tuple[str, Any]] = {
    "INT32": ("int32_false_true", int),
    "FP32": ("fp32_false_true", float),
    "BOOL": ("bool_false_true", bool),
}
KINDS = {
    "CONTROL_SEQUENCE_START": "start",
    "CONTROL_SEQUENCE_END": "end",
    "CONTROL_SEQUENCE_READY": "ready",
    "CONTROL_SEQUENCE_CORRID": "corrid",
}


@dataclass(frozen=True)
class Control:
    """A control input: `kind` (start, end, ready, corrid), the tensor's OIP datatype
    and, for the flags, the values meaning false and true."""

    name: str
    kind: str
    datatype: str
    false_true: tuple[float, float] = (0, 1)


@dataclass(frozen=True)
class State:
    """An implicit state: the model's output `output` is fed back as its input
    `input` on the sequence's next request; zeros of `dims` at its start."""

    input: str
    output: str
    datatype: str
    dims: tuple[int, ...]
    # Its values at a sequence's start when not zeros (initial_state's data_file).
    initial: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SequenceSpec:
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    idle_s: float
    strategy: str  # "direct" or "oldest"
    max_candidate_sequences: int = 0  # oldest's slots per instance; 0: unset

    def slots(self, max_batch_size: int, instances: int) -> int:
        """The sequences that may be live at once, as Triton counts its batch slots:
        per instance `max(1, max_batch_size)`, or oldest's `max_candidate_sequences`."""
        per_instance = max(1, max_batch_size)
        if self.strategy == "oldest" and self.max_candidate_sequences > 0:
            per_instance = self.max_candidate_sequences
        return per_instance * instances

    def config_json(self, delay_us: int, preferred: list[int]) -> dict[str, Any]:
        """The `sequence_batching` block as Triton's model config endpoint returns it
        (JSON), so that clients that read it (perf_analyzer, say) see a stateful model."""
        controls: dict[str, list[dict[str, Any]]] = {}
        for c in self.controls:
            control: dict[str, Any] = {"kind": f"CONTROL_SEQUENCE_{c.kind.upper()}"}
            if c.kind == "corrid":
                control["data_type"] = triton_type(c.datatype)
            else:
                key, cast = _FALSE_TRUE[c.datatype]
                control[key] = [cast(v) for v in c.false_true]
            controls.setdefault(c.name, []).append(control)
        strategy: dict[str, Any] = {"max_queue_delay_microseconds": delay_us}
        if self.strategy == "oldest":
            strategy["max_candidate_sequences"] = self.max_candidate_sequences
            strategy["preferred_batch_size"] = preferred
        states = [
            {"input_name": s.input, "output_name": s.output,
             "data_type": triton_type(s.datatype), "dims": list(s.dims)}
            for s in self.states
        ]  # fmt: skip
        return {
            "max_sequence_idle_microseconds": round(self.idle_s * 1e6),
            "control_input": [{"name": n, "control": c} for n, c in controls.items()],
            "state": states,
            self.strategy: strategy,
        }

    @property
    def inputs(self) -> set[str]:
        """Inputs the agent fills in, never the client."""
        return {c.name for c in self.controls} | {s.input for s in self.states}

    @property
    def outputs(self) -> set[str]:
        """Outputs the agent keeps, never returned to the client."""
        return {s.output for s in self.states}


def sequence_spec(blocks: list[Any], directory: Path | None = None) -> SequenceSpec | None:
    """The `sequence_batching` block of a parsed config, or None; ValueError for what
    cannot be served as written. `directory` is the model's (its initial states)."""
    if not blocks:
        return None
    block: dict[str, list[Any]] = blocks[-1]  # as triton_config parses it
    controls = []
    for entry in block.get("control_input", []):
        name = str(entry["name"][0])
        for control in entry.get("control", []):
            kind = KINDS.get(str((control.get("kind") or ["CONTROL_SEQUENCE_START"])[-1]))
            if kind is None:
                raise ValueError(f"sequence_batching: control '{name}' has an unknown kind")
            if kind == "corrid":
                datatype = from_triton_type(str((control.get("data_type") or ["TYPE_UINT64"])[-1]))
                controls.append(Control(name, kind, datatype))
                continue
            for flag, datatype in (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"),
                                    ("bool_false_true", "BOOL")):  # fmt: skip
                values = control.get(flag)
                if values:
                    if len(values) != 2:
                        raise ValueError(f"sequence_batching: control '{name}': {flag} needs 2")
                    controls.append(Control(name, kind, datatype, (values[0], values[1])))
                    break
            else:
                raise ValueError(f"sequence_batching: control '{name}' has no false/true values")
    states = []
    for entry in block.get("state", []):
        state = State(str(entry["input_name"][0]), str(entry["output_name"][0]),
                      from_triton_type(str((entry.get("data_type") or ["TYPE_FP32"])[-1])),
                      tuple(int(d) for d in entry.get("dims", [])))  # fmt: skip
        initial = initial_state(state, entry.get("initial_state", []), directory)
        states.append(state if initial is None else replace(state, initial=initial))
    idle_us = int((block.get("max_sequence_idle_microseconds") or [DEFAULT_IDLE_US])[-1])
    strategy = "oldest" if "oldest" in block else "direct"
    candidates = 0
    for oldest in block.get("oldest", []):
        candidates = int((oldest.get("max_candidate_sequences") or [0])[-1])
    return SequenceSpec(tuple(controls), tuple(states), idle_us / 1e6, strategy, candidates)


def initial_state(state: State, entries: list[Any], directory: Path | None) -> np.ndarray | None:
    """A state's `initial_state` values, or None for zeros (`zero_data`, or none set).
    A `data_file` is a plain name in the model's initial_state folder holding exactly
    the values its fixed `dims` and `data_type` need (strings are not supported)."""
    if not entries:
        return None
    if len(entries) > 1:
        raise ValueError(
            f"sequence_batching: state '{state.input}' has more than one initial_state"
        )
    entry: dict[str, list[Any]] = entries[0]
    name = str((entry.get("data_file") or [""])[-1])
    if not name:
        return None  # zero_data: zeros, as with no initial state
    where = f"sequence_batching: state '{state.input}': initial_state data_file {name!r}"
    datatype = from_triton_type(str((entry.get("data_type") or ["TYPE_FP32"])[-1]))
    if datatype != state.datatype:
        raise ValueError(f"{where}: its data_type is not the state's ({state.datatype})")
    dims = tuple(int(d) for d in entry.get("dims", []))
    if any(d < 0 for d in dims):
        raise ValueError(f"{where}: its dims must be fixed, not {list(dims)}")
    dtype = OIP_TO_NUMPY.get(datatype)
    if dtype is None or dtype.kind == "O":
        raise ValueError(f"{where}: initial values of type {datatype} are not supported")
    need = math.prod(dims) * dtype.itemsize
    if need > MAX_INITIAL_STATE_BYTES:
        raise ValueError(f"{where}: {need} bytes, more than {MAX_INITIAL_STATE_BYTES}")
    if directory is None:
        raise ValueError(f"{where}: the model's folder is not known")
    folder, place = directory / INITIAL_STATE_DIR, f"{INITIAL_STATE_DIR} folder"
    data = read_model_file(folder, name, MAX_INITIAL_STATE_BYTES, where, place)
    if len(data) != need:
        raise ValueError(
            f"{where} holds {len(data)} bytes; dims {list(dims)} of {datatype} need {need}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(dims)
