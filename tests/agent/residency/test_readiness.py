"""Server readiness follows the runners: false while every runner that was started
is down (restarting), true again once one serves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeplex.agent.config import AgentSettings
from edgeplex.agent.residency.effects import RunnerEffects


@dataclass
class FakeRunner:
    state: str


class FakePool:
    def __init__(self, *states: str) -> None:
        self.list = [FakeRunner(s) for s in states]

    def runners(self) -> list[FakeRunner]:
        return self.list


def effects(*states: str, tmp_path: Path) -> RunnerEffects:
    settings = AgentSettings(model_repo=tmp_path)
    return RunnerEffects(settings, FakePool(*states), tmp_path)  # type: ignore[arg-type]


def test_ready_while_some_runner_serves(tmp_path):
    assert effects(tmp_path=tmp_path).runners_can_serve()  # none started yet
    assert effects("ready", "restarting", tmp_path=tmp_path).runners_can_serve()


def test_not_ready_while_every_started_runner_is_down(tmp_path):
    assert not effects("restarting", tmp_path=tmp_path).runners_can_serve()
    assert not effects("restarting", "starting", tmp_path=tmp_path).runners_can_serve()
