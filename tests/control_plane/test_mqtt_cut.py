"""MQTT connections that die silently: a NAT or firewall on the way drops a
connection's state (no reset, no FIN; new connections go through), and whoever
holds the connection finds it dead by the fleet's keepalive and silence bound
(edgeplex/fleet.py), reconnects, and the desired state gets through.

Left to paho's defaults, a connection nothing is sent on is found dead after two
keepalives of 60 s, and the site misses every desired state meanwhile."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager

import pytest

from edgeplex.agent.catalog import demo
from edgeplex.fleet import MQTT_KEEPALIVE_S, MQTT_SILENCE_S
from tests.support.fleet import Fleet, agent_tier, running_fleet
from tests.support.netcut import cut_open_connections, needs_cut
from tests.support.waiting import wait_until

pytestmark = needs_cut
# A ping at most a keepalive after the cut, unacknowledged for the silence bound;
# then a reconnect, the retained desired state and the model's load.
SITE_HEARS_WITHIN_S = MQTT_KEEPALIVE_S + MQTT_SILENCE_S + 4
# The publish itself unacknowledged for the silence bound; then a reconnect, the
# message sent again and the model's load (aiomqtt alone gives up on a publish
# after 10 s, and waits as long again for the dead connection to close).
PUBLISHER_RESENDS_WITHIN_S = MQTT_SILENCE_S + 4


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("mqtt-cut")
    with running_fleet(workdir) as f:
        for seed, name in enumerate(("first", "second")):
            demo.make_mlp(workdir / "src" / name, width=16, layers=1, seed=seed)
            f.artifacts[name] = workdir / "src" / name / "1" / "model.onnx"
        agent = f.start_agent("a1", "a")
        wait_until(lambda: "subscribed to" in agent.log(), what="a1 subscribed")
        yield f


def _placed_and_heard(fleet: Fleet, model: str, cut: AbstractContextManager[None]) -> float:
    """Seconds from a model's addition (pinned: placed at every site) under `cut`
    until the site has it."""
    agent = fleet.agents["a1"]
    with cut:
        start = time.monotonic()
        fleet.add_model(model, fleet.artifacts[model], pin=True)
        wait_until(
            lambda: agent_tier(agent, model) != "",
            timeout=SITE_HEARS_WITHIN_S + 20,
            what=f"{model} at a1",
        )
        took = time.monotonic() - start
    print(f"{model} reached a1 {took:.1f} s after it was placed")
    return took


def test_a_site_whose_broker_connection_died_hears_the_next_desired_state(
    fleet: Fleet,
) -> None:
    agent = fleet.agents["a1"]
    assert agent.process is not None
    cut = cut_open_connections(agent.process.pid, fleet.mqtt.port)
    took = _placed_and_heard(fleet, "first", cut)
    assert took <= SITE_HEARS_WITHIN_S, took
    assert "MQTT unavailable" in agent.log()


def test_a_control_plane_whose_broker_connection_died_sends_again(fleet: Fleet) -> None:
    assert fleet.cp.process is not None
    cut = cut_open_connections(fleet.cp.process.pid, fleet.mqtt.port)
    took = _placed_and_heard(fleet, "second", cut)
    assert took <= PUBLISHER_RESENDS_WITHIN_S, took
    assert "MQTT unavailable" in fleet.cp.log()
