"""Triton's sequence batcher, as edgeplex runs it: the live sequences of stateful
models (config.pbtxt `sequence_batching`; catalog/sequence_config.py).

A request of a sequence names its correlation id and whether it starts or ends
the sequence (`sequence_id`, `sequence_start`, `sequence_end`). Per sequence:

- its requests run one at a time, in the order they arrived (a lock per
  sequence; requests of different sequences batch together as any requests do);
- the agent fills in the control inputs the model declares (START, END, READY,
  CORRID) and the implicit state: zeros (or its initial_state's values) at the
  start, then what the model's state output was on the sequence's previous
  request, never shown to the client;
- the model stays resident while the sequence lives (it is held: never evicted
  nor swapped to a smaller form; residency/owner.py), until its END, or until no
  request came for `max_sequence_idle_microseconds`, when the sequence is
  dropped and its next request must START again.

A model version has a fixed number of sequence slots, as in Triton: with the
`direct` strategy `max(1, max_batch_size)` per instance, with `oldest` its
`max_candidate_sequences` per instance (`max(1, max_batch_size)` when unset).
A sequence holds a slot from its START to its END or idle timeout. A START that
finds every slot taken waits in the model's backlog, oldest first, until a slot
frees or its deadline passes; the backlog holds at most the model's
`max_queue_size` sequences, and a START beyond that is refused (QueueFull), so
neither live sequences nor their state grow with what clients send. Batches
take what is queued of the slotted sequences, one request of a sequence at a
time, waiting for more as long as the strategy's `max_queue_delay_microseconds`
(the model's `max_queue_delay_us`; catalog/triton_config.py) says. Triton's
`direct` also pins a sequence to one instance's batch slot; here every instance
runs the same session and the agent carries the state, so any instance serves
any sequence.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeplex.agent.catalog.sequence_config import SequenceSpec
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import DeadlineExceeded, InvalidInput, QueueFull, Unavailable
from edgeplex.agent.oip.requests import InferInput
from edgeplex.agent.oip.tensors import numpy_dtype

Id = int | str


class UnknownSequence(InvalidInput):
    """A request in the middle of a sequence this site holds no state for."""


class SequenceNotHere(UnknownSequence):
    """UnknownSequence, for a request a peer forwarded: the sequence may be at another
    site holding the model. Marked on the wire (`edgeplex-sequence-not-here`), so the
    forwarder tries the model's other holders before the caller has this error."""

    sequence_not_here = True


@dataclass(frozen=True)
class Flags:
    """A request's place in its sequence, as its parameters say."""

    id: Id
    start: bool
    end: bool


@dataclass
class Live:
    """One live sequence, and the place of the request whose turn it is (`flags`)."""

    key: tuple[str, str, Id]  # model, version, correlation id
    spec: SequenceSpec
    flags: Flags
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    slotted: bool = False  # holds one of its model's sequence slots


@dataclass
class Slots:
    """The sequence slots of one model version: `taken` of `size` are held; STARTs
    that found none free wait in `backlog`, oldest first, each for a slot handed on."""

    size: int
    hold: Any  # the model's hold (residency): kept resident while any slot is taken
    taken: int = 0
    backlog: deque[asyncio.Future[None]] = field(default_factory=deque)


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
        self._slots: dict[tuple[str, str], Slots] = {}  # model versions with live sequences
        self._hold, self._release = hold, release  # a model's hold, taken and given back
        self._closed: str | None = None  # why no sequence may begin any more

    async def enter(
        self,
        model: str,
        version: str,
        spec: SequenceSpec,
        flags: Flags | None,
        slots: int,
        backlog: int,
        deadline: float,
    ) -> Live:
        """The request's sequence, its turn taken (the caller must `leave` it). A new
        sequence first takes one of the model's `slots`, waiting until `deadline` in a
        backlog of at most `backlog` sequences when none is free."""
        if flags is None:
            raise InvalidInput(
                f"inference request to model '{model}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        key = (model, version, flags.id)
        live = self._live.get(key)
        if live is None and flags.start:
            live = self._live[key] = Live(key, spec, flags)
        if live is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    await live.lock.acquire()
            except TimeoutError:
                raise DeadlineExceeded(
                    f"model '{model}': request timed out waiting for its turn in sequence "
                    f"{flags.id}"
                ) from None
            if self._live.get(key) is not live:  # it ended while this request waited
                if flags.start:
                    self._live[key] = live
                else:
                    live.lock.release()
                    live = None
        if live is None:
            raise UnknownSequence(
                f"inference request for sequence {flags.id} to model '{model}' must "
                "specify the START flag on the first request of the sequence"
            )
        if live.timer is not None:
            live.timer.cancel()
            live.timer = None
        live.flags = flags
        if not live.slotted:  # a START, its sequence new or ended while it waited
            try:
                await self._take_slot(live, slots, backlog, deadline)
            except BaseException:
                live.lock.release()
                self._drop(live)  # the sequence never began
                raise
        if flags.start:
            live.state.clear()  # a START begins the sequence anew
        return live

    async def _take_slot(self, live: Live, size: int, backlog: int, deadline: float) -> None:
        model, version, _ = live.key
        if self._closed is not None:
            raise Unavailable(self._closed)
        slots = self._slots.get((model, version))
        if slots is None:
            slots = self._slots[(model, version)] = Slots(size, self._hold(model, version))
        slots.size = size  # the model's config may have changed since
        if slots.taken < slots.size and not slots.backlog:
            slots.taken += 1
            live.slotted = True
            self._export(model)
            return
        if len(slots.backlog) >= backlog:
            raise QueueFull(
                f"model '{model}': every sequence slot is taken ({slots.size}) and "
                f"{len(slots.backlog)} sequences wait for one"
            )
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slots.backlog.append(handed)
        self._export(model)
        try:
            async with asyncio.timeout_at(deadline):
                await handed
        except TimeoutError:
            raise DeadlineExceeded(
                f"model '{model}': request timed out waiting for a sequence slot "
                f"({slots.size} taken)"
            ) from None
        finally:
            if handed.done() and not handed.cancelled() and handed.exception() is None:
                live.slotted = True  # handed a slot: kept, or given back by the caller's _drop
            elif handed in slots.backlog:
                slots.backlog.remove(handed)
            self._export(model)

    @staticmethod
    def inputs(live: Live, given: list[InferInput], batching: bool) -> list[InferInput]:
        """The client's inputs with the controls and the state filled in (with a batch
        dimension, the client's, when the model batches)."""
        spec, flags = live.spec, live.flags
        batch = given[0].shape[0] if batching and given and given[0].shape else 1
        rows = [batch] if batching else []
        out = [t for t in given if t.name not in spec.inputs]
        for control in spec.controls:
            if control.kind == "corrid":
                if control.datatype == "BYTES":
                    array = np.full([*rows, 1], str(flags.id).encode(), dtype=object)
                else:
                    dtype = numpy_dtype(control.datatype, control.name)
                    array = np.full([*rows, 1], int(flags.id), dtype=dtype)
            else:
                on = {"start": flags.start, "end": flags.end, "ready": True}[control.kind]
                dtype = numpy_dtype(control.datatype, control.name)
                array = np.full([*rows, 1], control.false_true[on], dtype=dtype)
            out.append(InferInput(control.name, control.datatype, list(array.shape), array))
        for state in spec.states:
            kept = live.state.get(state.input)
            if kept is None and state.initial is not None:  # its initial_state's values
                kept = np.ascontiguousarray(
                    np.broadcast_to(state.initial, [*rows, *state.initial.shape])
                )
            elif kept is None:  # zeros of the declared shape at the sequence's start
                dims = [*rows, *(1 if d < 0 else d for d in state.dims)]
                kept = np.zeros(dims, dtype=numpy_dtype(state.datatype, state.input))
            out.append(InferInput(state.input, state.datatype, list(kept.shape), kept))
        return out

    @staticmethod
    def outputs(live: Live, requested: list[str] | None) -> list[str] | None:
        """The outputs to ask the model for: the client's, and the state outputs."""
        states = live.spec.states
        if requested is None or not states:
            return requested
        return [*requested, *(s.output for s in states if s.output not in requested)]

    @staticmethod
    def keep(
        live: Live, outputs: dict[str, np.ndarray], requested: list[str] | None
    ) -> dict[str, np.ndarray]:
        """The state the model wrote, kept for the next request; the rest returned."""
        for state in live.spec.states:
            if state.output in outputs:
                live.state[state.input] = outputs[state.output]
        hidden = live.spec.outputs - set(requested or ())
        return {k: v for k, v in outputs.items() if k not in hidden}

    def leave(self, live: Live, served: bool) -> None:
        """The request is done: an END (or a START that failed) ends the sequence;
        otherwise it waits for its next request, at most the idle timeout."""
        live.lock.release()
        flags = live.flags
        if flags.end or (flags.start and not served):
            self._drop(live)
            return
        loop = asyncio.get_running_loop()
        live.timer = loop.call_later(live.spec.idle_s, self._idle, live)

    def _idle(self, live: Live) -> None:
        if not live.lock.locked():
            self._drop(live)

    def _drop(self, live: Live) -> None:
        if self._live.get(live.key) is live:
            del self._live[live.key]
        if live.slotted:
            live.slotted = False
            self._free_slot(live.key[0], live.key[1])
        if live.timer is not None:
            live.timer.cancel()
            live.timer = None

    def _free_slot(self, model: str, version: str) -> None:
        """A sequence gave its slot back: to the oldest START still waiting, if any."""
        slots = self._slots[(model, version)]
        while slots.backlog and slots.taken <= slots.size:  # (fewer slots since: not handed)
            handed = slots.backlog.popleft()
            if not handed.done():
                handed.set_result(None)
                self._export(model)
                return
        slots.taken -= 1
        if slots.taken == 0:
            del self._slots[(model, version)]
            if slots.hold is not None:
                self._release(slots.hold)
        self._export(model)

    def close(self, why: str) -> None:
        """The agent is shutting down: STARTs waiting for a slot fail now (Unavailable,
        `why`) instead of holding the drain up, and no sequence begins any more. Live
        sequences' requests still run."""
        self._closed = why
        for (model, _), slots in self._slots.items():
            while slots.backlog:
                handed = slots.backlog.popleft()
                if not handed.done():
                    handed.set_exception(Unavailable(why))
            self._export(model)

    def _export(self, model: str) -> None:
        """edgeplex_agent_sequences for `model`, its versions together."""
        live = waiting = 0
        for (name, _), slots in self._slots.items():
            if name == model:
                live, waiting = live + slots.taken, waiting + len(slots.backlog)
        METRICS.sequences.labels(model=model, state="live").set(live)
        METRICS.sequences.labels(model=model, state="waiting").set(waiting)

    def counts(self, model: str, version: str) -> tuple[int, int]:
        """A model version's sequences holding a slot, and those waiting for one."""
        slots = self._slots.get((model, version))
        return (slots.taken, len(slots.backlog)) if slots is not None else (0, 0)
