"""Triton's sequence batcher, as edgeplex runs it: the live sequences of stateful
models (config.pbtxt `sequence_batching`; catalog/sequence_config.py).

A request of a sequence names its correlation id and whether it starts or ends
the sequence (`sequence_id`, `sequence_start`, `sequence_end`). Per sequence:

- its requests run one at a time, in the order they arrived (a lock per
  sequence; requests of different sequences batch together as any requests do);
- the agent fills in the control inputs the model declares (START, END, READY,
  CORRID) and the implicit state: zeros at the start, then what the model's
  state output was on the sequence's previous request, never shown to the client;
- the model stays resident while the sequence lives (it holds a lease), until
  its END, or until no request came for `max_sequence_idle_microseconds`, when
  the sequence is dropped and its next request must START again.

Both of Triton's strategies (direct, oldest) are served the same way: each
sequence's order is kept, and batches take what is queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeplex.agent.catalog.sequence_config import SequenceSpec
from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.requests import InferInput
from edgeplex.agent.oip.tensors import numpy_dtype

Id = int | str


@dataclass(frozen=True)
class Flags:
    """A request's place in its sequence, as its parameters say."""

    id: Id
    start: bool
    end: bool


@dataclass
class Live:
    model: str
    id: Id
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    started: bool = False
    timer: asyncio.TimerHandle | None = None
    hold: Any = None  # the residency lease that keeps the model while the sequence lives


def flags_of(parameters: dict[str, Any]) -> Flags | None:
    """A request's sequence flags from its parameters (HTTP or gRPC), or None."""
    sequence_id = parameters.get("sequence_id")
    if sequence_id in (None, 0, ""):
        return None
    if not isinstance(sequence_id, int | str) or isinstance(sequence_id, bool):
        raise InvalidInput("'sequence_id' must be an integer or a string")
    start, end = parameters.get("sequence_start", False), parameters.get("sequence_end", False)
    if not isinstance(start, bool) or not isinstance(end, bool):
        raise InvalidInput("'sequence_start' and 'sequence_end' must be true or false")
    return Flags(sequence_id, start, end)


class Sequences:
    """The live sequences of every model, by (model, version, correlation id)."""

    def __init__(self, hold: Callable[[str, str], Any], release: Callable[[Any], None]) -> None:
        self._live: dict[tuple[str, str, Id], Live] = {}
        self._hold, self._release = hold, release  # a residency lease, taken and given back

    def __len__(self) -> int:
        return len(self._live)

    async def enter(
        self, model: str, version: str, spec: SequenceSpec, flags: Flags | None
    ) -> Live:
        """The request's sequence, its turn taken (the caller must `leave` it)."""
        if flags is None:
            raise InvalidInput(
                f"inference request to model '{model}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        key = (model, version, flags.id)
        live = self._live.get(key)
        if live is None:
            if not flags.start:
                raise InvalidInput(
                    f"inference request for sequence {flags.id} to model '{model}' must "
                    "specify the START flag on the first request of the sequence"
                )
            live = self._live[key] = Live(model, flags.id)
        await live.lock.acquire()
        if live.timer is not None:
            live.timer.cancel()
            live.timer = None
        if flags.start:
            live.state.clear()  # a START begins the sequence anew
            live.started = False
        return live

    def inputs(
        self, spec: SequenceSpec, live: Live, flags: Flags, given: list[InferInput],
        batching: bool,
    ) -> list[InferInput]:  # fmt: skip
        """The client's inputs with the controls and the state filled in (with a batch
        dimension, the client's, when the model batches)."""
        batch = given[0].shape[0] if batching and given and given[0].shape else 1
        rows = [batch] if batching else []
        out = [t for t in given if t.name not in spec.inputs]
        for control in spec.controls:
            if control.kind == "corrid":
                value: Any = flags.id if control.datatype == "BYTES" else int(flags.id)
                if control.datatype == "BYTES":
                    array = np.full([*rows, 1], str(value).encode(), dtype=object)
                else:
                    dtype = numpy_dtype(control.datatype, control.name)
                    array = np.full([*rows, 1], value, dtype=dtype)
            else:
                on = {"start": flags.start, "end": flags.end, "ready": True}[control.kind]
                value = control.false_true[1] if on else control.false_true[0]
                dtype = numpy_dtype(control.datatype, control.name)
                array = np.full([*rows, 1], value, dtype=dtype)
            out.append(InferInput(control.name, control.datatype, list(array.shape), array))
        for state in spec.states:
            kept = live.state.get(state.input)
            if kept is None:  # zeros of the declared shape at the sequence's start
                dims = [*rows, *(1 if d < 0 else d for d in state.dims)]
                kept = np.zeros(dims, dtype=numpy_dtype(state.datatype, state.input))
            array = kept
            out.append(InferInput(state.input, state.datatype, list(array.shape), array))
        return out

    @staticmethod
    def outputs(spec: SequenceSpec, requested: list[str] | None) -> list[str] | None:
        """The outputs to ask the model for: the client's, and the state outputs."""
        if requested is None or not spec.states:
            return requested
        return [*requested, *(s.output for s in spec.states if s.output not in requested)]

    def keep(
        self,
        spec: SequenceSpec,
        live: Live,
        outputs: dict[str, np.ndarray],
        requested: list[str] | None,
    ) -> dict[str, np.ndarray]:
        """The state the model wrote, kept for the next request; the rest returned."""
        for state in spec.states:
            if state.output in outputs:
                live.state[state.input] = outputs[state.output]
        live.started = True
        hidden = spec.outputs - set(requested or ())
        return {k: v for k, v in outputs.items() if k not in hidden}

    def leave(
        self, spec: SequenceSpec, live: Live, version: str, flags: Flags, served: bool
    ) -> None:
        """The request is done: an END (or a START that failed) ends the sequence;
        otherwise it waits for its next request, at most the idle timeout."""
        key = (live.model, version, live.id)
        live.lock.release()
        if flags.end or (flags.start and not served):
            self._drop(key)
            return
        if served and live.hold is None:
            live.hold = self._hold(live.model, version)
        loop = asyncio.get_running_loop()
        live.timer = loop.call_later(spec.idle_s, self._idle, key, live)

    def _idle(self, key: tuple[str, str, Id], live: Live) -> None:
        if self._live.get(key) is live and not live.lock.locked():
            self._drop(key)

    def _drop(self, key: tuple[str, str, Id]) -> None:
        live = self._live.pop(key, None)
        if live is None:
            return
        if live.timer is not None:
            live.timer.cancel()
        if live.hold is not None:
            self._release(live.hold)
            live.hold = None

    def live_of(self, model: str) -> int:
        return sum(1 for (name, _, _) in self._live if name == model)
