"""Random sequences of load, infer, pin, unpin, unload and demote against a real
agent with a tight device budget. After every step: the loaded tier fits the
budget, pinned models stay loaded, and unloaded models refuse requests."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent
from tests.support.agent import infer_http, memory, post, status

pytestmark = pytest.mark.slow
MODELS = [f"s{i}" for i in range(5)]


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    repo = tmp_path_factory.mktemp("stateful")
    for i, name in enumerate(MODELS):
        demo.make_mlp(repo / name, width=512, layers=4, seed=i, in_width=64)
    proc = start_agent(
        repo,
        tmp_path_factory.mktemp("stateful-agent"),
        env={
            "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": "12MiB",  # about three of the five
            "EDGEPLEX_AGENT_LOAD_MODELS_AT_START": "false",
            "EDGEPLEX_AGENT_PRESTAGE": "false",
        },
    )
    yield proc
    assert proc.stop() == 0, proc.log()


def test_random_operations_keep_the_invariants(agent):
    budget = memory(agent)["tiers"]["loaded"]["budget"]
    names = st.sampled_from(MODELS)
    checks: list[int] = []

    class Residency(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            for name in MODELS:  # every example starts from the same place
                post(agent, f"/edgeplex/v1/models/{name}/unpin")
                post(agent, f"/v2/repository/models/{name}/load")
                post(agent, f"/edgeplex/v1/models/{name}/demote", {"tier": "cached"})
            self.pinned: set[str] = set()
            self.disabled: set[str] = set()
            self.held: set[str] = set()  # pinned, loaded, and not demoted since

        @rule(name=names)
        def infer(self, name: str) -> None:
            code, _, body = infer_http(agent, name)
            if name in self.disabled:
                assert code == 503, body
            elif len(self.pinned - {name}) >= 3:
                assert code in (200, 507), body  # pins may hold the whole budget
            else:
                assert code == 200, body
            if code == 200 and name in self.pinned:
                self.held.add(name)

        @rule(name=names)
        def pin(self, name: str) -> None:
            if len(self.pinned | {name}) <= 2:  # leave room for the others
                assert post(agent, f"/edgeplex/v1/models/{name}/pin") == 200
                self.pinned.add(name)
                if name not in self.disabled:
                    self.infer(name)

        @rule(name=names)
        def unpin(self, name: str) -> None:
            assert post(agent, f"/edgeplex/v1/models/{name}/unpin") == 200
            self.pinned.discard(name)
            self.held.discard(name)

        @rule(name=names)
        def unload(self, name: str) -> None:
            assert post(agent, f"/v2/repository/models/{name}/unload") == 200
            self.disabled.add(name)
            self.held.discard(name)

        @rule(name=names)
        def load(self, name: str) -> None:
            code = post(agent, f"/v2/repository/models/{name}/load")
            assert code in (200, 507)
            if code == 200:
                self.disabled.discard(name)

        @rule(name=names, tier=st.sampled_from(["staged", "cached"]))
        def demote(self, name: str, tier: str) -> None:
            assert post(agent, f"/edgeplex/v1/models/{name}/demote", {"tier": tier}) == 200
            self.held.discard(name)

        @invariant()
        def within_budget_and_pins_hold(self) -> None:
            checks.append(1)
            models = status(agent)
            loaded = sum(m["memory_bytes"] for m in models.values() if m["tier"] == "loaded")
            assert loaded <= budget, models
            for name in MODELS:
                assert models[name]["state"] != "FAILED", models[name]
            for name in self.held:
                assert models[name]["tier"] == "loaded", f"pinned {name} was evicted"

    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        Residency,
        settings=settings(
            max_examples=6,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert len(checks) >= 30, "the state machine barely ran"
