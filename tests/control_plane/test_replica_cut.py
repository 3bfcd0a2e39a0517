"""A control-plane replica cut off from a site: the site moves to the next replica
before its lease lapses, and is never marked down.

The agent reports over one long gRPC stream. When the link to its replica is cut
(no reset, no FIN), its reports go unacknowledged; the stream fails after
CONTROL_PLANE_SILENCE_S and the agent registers at the next replica it knows. Left
to the kernel, the stream would hang until retransmission gave up (about 15
minutes), the site marked down meanwhile. The control planes run with the default
site lease and report interval, which the bound is sized for.

The replica cut off ends the agent's dead stream by its own bound (it pings a
stream's connection that fell silent, and closes it when the ping goes
unanswered); left to gRPC's defaults, it held the stream for two hours."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from edgeplex.agent.fleet.link import CONTROL_PLANE_SILENCE_S
from edgeplex.control_plane.server import AGENT_PING_AFTER_S, AGENT_SILENCE_S
from edgeplex.net import free_ports
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.conftest import AgentProcess, start_agent
from tests.services import TOKEN, ControlPlane, Mosquitto, RedisServer, fleet_env
from tests.support.netcut import cut, needs_cut
from tests.support.waiting import wait_until

pytestmark = needs_cut
SITE_LEASE_S, REPORT_INTERVAL_S = 10.0, 2.0  # the control plane's defaults
DEFAULTS = {"EDGEPLEX_CP_SITE_LEASE_S": "10", "EDGEPLEX_CP_REPORT_INTERVAL_S": "2"}
REGISTERED = "registered with the control plane"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[ControlPlane, ControlPlane, AgentProcess]]:
    r, m = RedisServer(tmp_path), Mosquitto(tmp_path)
    r.start()
    m.start()
    first, second = (
        ControlPlane(tmp_path, r, m.url(), **DEFAULTS, EDGEPLEX_CP_HTTP_PORT=str(port))
        for port in free_ports(2)
    )
    first.start()
    second.start()
    (tmp_path / "repo").mkdir()
    env = fleet_env(first, m.url(), "a1", "a")
    env["EDGEPLEX_AGENT_FLEET__CONTROL_PLANE"] = f"{first.address},{second.address}"
    agent = start_agent(tmp_path / "repo", tmp_path, env=env)
    try:
        yield first, second, agent
    finally:
        agent.stop()
        second.stop()
        first.stop()
        m.stop()
        r.stop()


def _up(cp: ControlPlane) -> bool:
    with grpc.insecure_channel(cp.address) as channel:
        sites = pb_grpc.AdminServiceStub(channel).ListSites(
            pb.ListSitesRequest(), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=5
        )
    return any(s.site_id == "a1" and s.up for s in sites.sites)


def _report_streams(cp: ControlPlane) -> float:
    """The replica's open report streams, from its /metrics."""
    url = f"http://127.0.0.1:{cp.env['EDGEPLEX_CP_HTTP_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("edgeplex_cp_report_streams ")
    )


def test_a_site_cut_off_from_its_replica_moves_to_the_next(fleet) -> None:  # type: ignore[no-untyped-def]
    first, second, agent = fleet
    # The replica marks the site up before the agent has read its reply: wait for both.
    wait_until(lambda: _up(second) and REGISTERED in agent.log(), what="a1 up and registered")
    assert agent.log().count(REGISTERED) == 1  # at the first replica it knows
    assert _report_streams(first) == 1 and _report_streams(second) == 0
    with cut(first.port):
        cut_at = time.monotonic()
        moved = None
        while time.monotonic() - cut_at < SITE_LEASE_S + 5:
            assert _up(second), f"a1 marked down {time.monotonic() - cut_at:.1f} s after the cut"
            if moved is None and agent.log().count(REGISTERED) == 2:
                moved = time.monotonic() - cut_at
            time.sleep(0.5)
        # The first replica's dead stream ends once a ping after AGENT_PING_AFTER_S of
        # silence goes unanswered for AGENT_SILENCE_S.
        ended = wait_until(
            lambda: _report_streams(first) == 0, timeout=30, what="the dead stream ends"
        )
        ended_after = time.monotonic() - cut_at
        print(f"the dead stream ended {ended_after:.1f} s after the cut")
    assert _report_streams(second) == 1
    assert ended and ended_after <= AGENT_PING_AFTER_S + AGENT_SILENCE_S + 3, ended_after
    assert moved is not None, agent.log()[-3000:]
    # The first report after the cut goes unacknowledged for the bound, then a
    # backoff of at most 0.2 s and a registration.
    assert moved <= REPORT_INTERVAL_S + CONTROL_PLANE_SILENCE_S + 1.5, moved
    assert f"control plane {first.address} unavailable" in agent.log()
