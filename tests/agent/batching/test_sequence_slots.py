"""The sequence slots of agent/batching/sequences.py, driven directly: STARTs beyond
the slots wait oldest first, a waiter that leaves (its deadline, its caller gone)
gives up its place or passes on a slot it was just handed, the backlog is bounded,
and the model is held once while any of its sequences lives."""

from __future__ import annotations

import asyncio

import pytest

from edgeplex.agent.batching.sequences import Flags, Live, Sequences
from edgeplex.agent.catalog.sequence_config import SequenceSpec
from edgeplex.agent.oip.errors import DeadlineExceeded, QueueFull, Unavailable

SPEC = SequenceSpec(controls=(), states=(), idle_s=60.0, strategy="direct")


class Holds:
    def __init__(self) -> None:
        self.held: list[str] = []

    def hold(self, model: str, version: str) -> str:
        self.held.append(model)
        return model

    def release(self, token: str) -> None:
        self.held.remove(token)


async def _start(sequences: Sequences, sid: int, slots: int = 2, backlog: int = 4,
                 wait_s: float = 5.0) -> Live:  # fmt: skip
    deadline = asyncio.get_running_loop().time() + wait_s
    return await sequences.enter("m", "1", SPEC, Flags(sid, True, False), slots, backlog, deadline)


async def _end(sequences: Sequences, live: Live) -> None:
    ending = await sequences.enter("m", "1", SPEC, Flags(live.flags.id, False, True), 2, 4, 1e9)
    sequences.leave(ending, served=True)


async def test_starts_beyond_the_slots_wait_oldest_first_and_the_model_is_held_once() -> None:
    holds = Holds()
    sequences = Sequences(holds.hold, holds.release)
    first = await _start(sequences, 1)
    sequences.leave(first, served=True)
    second = await _start(sequences, 2)
    sequences.leave(second, served=True)
    assert sequences.counts("m", "1") == (2, 0) and holds.held == ["m"]
    waiting = [asyncio.create_task(_start(sequences, sid)) for sid in (3, 4)]
    await asyncio.sleep(0)
    assert sequences.counts("m", "1") == (2, 2) and not any(t.done() for t in waiting)
    await _end(sequences, first)
    third = await asyncio.wait_for(waiting[0], 1)  # the oldest START takes the slot
    assert third.flags.id == 3 and not waiting[1].done()
    await _end(sequences, second)
    fourth = await asyncio.wait_for(waiting[1], 1)
    for live in (third, fourth):
        sequences.leave(live, served=True)
        await _end(sequences, live)
    assert sequences.counts("m", "1") == (0, 0) and holds.held == []


async def test_a_full_backlog_refuses_and_a_waiter_past_its_deadline_leaves_it() -> None:
    holds = Holds()
    sequences = Sequences(holds.hold, holds.release)
    for sid in (1, 2):
        sequences.leave(await _start(sequences, sid), served=True)
    waiter = asyncio.create_task(_start(sequences, 3, backlog=1, wait_s=0.05))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull, match=r"every sequence slot is taken \(2\)"):
        await _start(sequences, 4, backlog=1)
    with pytest.raises(DeadlineExceeded, match="waiting for a sequence slot"):
        await waiter
    assert sequences.counts("m", "1") == (2, 0)  # its place is given up
    with pytest.raises(Exception, match="must specify the START flag"):
        await sequences.enter("m", "1", SPEC, Flags(3, False, False), 2, 1, 1e9)


async def test_a_waiter_cancelled_after_it_was_handed_a_slot_passes_it_on() -> None:
    holds = Holds()
    sequences = Sequences(holds.hold, holds.release)
    lives = [await _start(sequences, sid) for sid in (1, 2)]
    for live in lives:
        sequences.leave(live, served=True)
    gone = asyncio.create_task(_start(sequences, 3))
    next_one = asyncio.create_task(_start(sequences, 4))
    await asyncio.sleep(0)
    await _end(sequences, lives[0])  # hands the slot to sequence 3 ...
    gone.cancel()  # ... whose caller leaves before it runs again
    with pytest.raises(asyncio.CancelledError):
        await gone
    fourth = await asyncio.wait_for(next_one, 1)  # the slot went on to sequence 4
    assert fourth.flags.id == 4 and sequences.counts("m", "1") == (2, 0)
    sequences.leave(fourth, served=True)
    await _end(sequences, fourth)
    await _end(sequences, lives[1])
    assert sequences.counts("m", "1") == (0, 0) and holds.held == []


async def test_a_request_waiting_for_its_turn_in_its_sequence_fails_at_its_deadline() -> None:
    holds = Holds()
    sequences = Sequences(holds.hold, holds.release)
    running = await _start(sequences, 1)  # its request is running: the turn is taken
    loop = asyncio.get_running_loop()
    with pytest.raises(DeadlineExceeded, match="waiting for its turn in sequence 1"):
        await sequences.enter("m", "1", SPEC, Flags(1, False, False), 2, 4, loop.time() + 0.05)
    sequences.leave(running, served=True)
    after = await sequences.enter("m", "1", SPEC, Flags(1, False, True), 2, 4, loop.time() + 1)
    sequences.leave(after, served=True)  # the sequence went on, and ended
    assert sequences.counts("m", "1") == (0, 0)


async def test_closing_fails_the_waiting_starts_and_refuses_new_ones() -> None:
    holds = Holds()
    sequences = Sequences(holds.hold, holds.release)
    lives = [await _start(sequences, sid) for sid in (1, 2)]
    waiting = asyncio.create_task(_start(sequences, 3))
    await asyncio.sleep(0)
    sequences.close("the agent is shutting down")
    with pytest.raises(Unavailable, match="shutting down"):
        await waiting
    with pytest.raises(Unavailable, match="shutting down"):
        await _start(sequences, 4)
    for live in lives:  # live sequences' requests still run
        sequences.leave(live, served=True)
        await _end(sequences, live)
    assert sequences.counts("m", "1") == (0, 0) and holds.held == []
