"""The runner's state machine (RunnerState, TRANSITIONS): every state has its moves
listed, closed is final, and a move the table lacks is refused."""

from __future__ import annotations

import asyncio

import pytest

from edgeplex.agent.runners.settings import RunnerSettings
from edgeplex.agent.runners.supervisor import (
    TRANSITIONS,
    RunnerPool,
    RunnerProcess,
    RunnerState,
)


def test_every_state_has_its_moves_and_closed_is_final() -> None:
    assert set(TRANSITIONS) == set(RunnerState)
    assert TRANSITIONS[RunnerState.CLOSED] == frozenset()
    for state, moves in TRANSITIONS.items():
        if state != RunnerState.CLOSED:
            assert RunnerState.CLOSED in moves, state  # any runner can be stopped


def test_a_move_the_table_lacks_is_refused() -> None:
    pool = RunnerPool(RunnerSettings(sandbox="off"), "INFO", lambda _: None, lambda *_: None)
    runner = RunnerProcess("r", pool)
    with pytest.raises(RuntimeError, match="stopped -> ready is not a move"):
        runner._enter(RunnerState.READY)
    runner._enter(RunnerState.STARTING)
    runner._enter(RunnerState.READY)
    with pytest.raises(RuntimeError, match="ready -> starting"):
        runner._enter(RunnerState.STARTING)
    asyncio.run(pool.stop())  # its socket and rings directories go
