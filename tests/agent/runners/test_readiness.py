"""Server readiness follows the runners: false while every runner that was started
is down (restarting), true again once one serves (RunnerPool.can_serve)."""

from __future__ import annotations

import asyncio

from edgeplex.agent.runners.settings import RunnerSettings
from edgeplex.agent.runners.supervisor import RunnerPool, RunnerState


def can_serve(*states: RunnerState) -> bool:
    pool = RunnerPool(RunnerSettings(sandbox="off"), "INFO", lambda _: None, lambda *_: None)
    try:
        for i, state in enumerate(states):
            pool.get(f"r{i}").state = state
        return pool.can_serve()
    finally:
        for runner in pool.runners():
            runner.state = RunnerState.STOPPED
        asyncio.run(pool.stop())


def test_ready_while_some_runner_serves() -> None:
    assert can_serve()  # none started yet
    assert can_serve(RunnerState.READY, RunnerState.RESTARTING)


def test_not_ready_while_every_started_runner_is_down() -> None:
    assert not can_serve(RunnerState.RESTARTING)
    assert not can_serve(RunnerState.RESTARTING, RunnerState.STARTING)
