"""Triton's `sequence_batching` in config.pbtxt, read as edgeplex serves it: the
control inputs the agent fills in for each request of a sequence (START, END,
READY, CORRID) and the implicit state it carries from one request's outputs to the
next one's inputs (agent/batching/sequences.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeplex.agent.oip.tensors import from_triton_type

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
# The fields of `sequence_batching`, and of each of its states, that sequence_spec
# reads (a strategy only by its name): triton_config.py names the rest in warnings.
SEQUENCE_FIELDS = frozenset(
    {"control_input", "state", "max_sequence_idle_microseconds", "direct", "oldest"}
)
STATE_FIELDS = frozenset({"input_name", "output_name", "data_type", "dims"})
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

    @property
    def inputs(self) -> set[str]:
        """Inputs the agent fills in, never the client."""
        return {c.name for c in self.controls} | {s.input for s in self.states}

    @property
    def outputs(self) -> set[str]:
        """Outputs the agent keeps, never returned to the client."""
        return {s.output for s in self.states}


def sequence_spec(blocks: list[Any]) -> SequenceSpec | None:
    """The `sequence_batching` block of a parsed config, or None; ValueError for what
    cannot be served as written."""
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
            for field, datatype in (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"),
                                    ("bool_false_true", "BOOL")):  # fmt: skip
                values = control.get(field)
                if values:
                    if len(values) != 2:
                        raise ValueError(f"sequence_batching: control '{name}': {field} needs 2")
                    controls.append(Control(name, kind, datatype, (values[0], values[1])))
                    break
            else:
                raise ValueError(f"sequence_batching: control '{name}' has no false/true values")
    states = tuple(
        State(str(s["input_name"][0]), str(s["output_name"][0]),
              from_triton_type(str((s.get("data_type") or ["TYPE_FP32"])[-1])),
              tuple(int(d) for d in s.get("dims", [])))
        for s in block.get("state", [])
    )  # fmt: skip
    idle_us = int((block.get("max_sequence_idle_microseconds") or [DEFAULT_IDLE_US])[-1])
    strategy = "oldest" if "oldest" in block else "direct"
    candidates = 0
    for oldest in block.get("oldest", []):
        candidates = int((oldest.get("max_candidate_sequences") or [0])[-1])
    return SequenceSpec(tuple(controls), states, idle_us / 1e6, strategy, candidates)
