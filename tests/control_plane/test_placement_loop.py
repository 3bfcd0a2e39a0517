"""The leader's placement loop keeps its period: a round starts every
`placement_interval_s` from the start of the last one, whatever the round takes
and whatever the loop's once-a-second checks fall on."""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import grpc
import pytest

from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.services import TOKEN, ControlPlane, Mosquitto, RedisServer

pytestmark = pytest.mark.slow

AUTH = (("authorization", f"Bearer {TOKEN}"),)
INTERVAL_S = 1.5  # between two of the loop's one-second checks: a loop that ran
# rounds on those checks would place every 2 s


def test_rounds_start_every_placement_interval(tmp_path: Path) -> None:
    redis_server, mqtt = RedisServer(tmp_path), Mosquitto(tmp_path)
    redis_server.start()
    mqtt.start()
    cp = ControlPlane(
        tmp_path, redis_server, mqtt.url(), EDGEPLEX_CP_PLACEMENT_INTERVAL_S=str(INTERVAL_S)
    )
    cp.start()
    try:
        with grpc.insecure_channel(cp.address) as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            admin.AddSite(pb.AddSiteRequest(site_id="s1", region="r1"), metadata=AUTH, timeout=10)
            # Each round's version is the clock (µs) when it placed: new ones, as seen.
            versions: list[int] = []
            deadline = time.monotonic() + 30
            while len(versions) < 6 and time.monotonic() < deadline:
                placed = admin.GetPlacement(pb.PlacementRequest(), metadata=AUTH, timeout=5)
                if placed.version and (not versions or versions[-1] != placed.version):
                    versions.append(placed.version)
                time.sleep(0.05)
        # The first round seen may be one the site's registration woke early.
        spacing = [(b - a) / 1e6 for a, b in itertools.pairwise(versions[1:])]
        assert len(spacing) >= 4, versions
        assert statistics.median(spacing) == pytest.approx(INTERVAL_S, abs=0.2), spacing
    finally:
        cp.stop()
        mqtt.stop()
        redis_server.stop()


def test_a_tenant_change_reaches_the_sites_without_a_round(tmp_path: Path) -> None:
    """Placement does not read the tenants: a tenant added is sent to every site at
    once in a new desired state on the placement the leader has, not after a round
    of placement (a thousand sites: read and place, 2 s of the 3 s it took)."""
    import asyncio
    import zlib

    import aiomqtt

    from edgeplex.fleet import desired_topic, parse_mqtt_url

    redis_server, mqtt = RedisServer(tmp_path), Mosquitto(tmp_path)
    redis_server.start()
    mqtt.start()
    cp = ControlPlane(tmp_path, redis_server, mqtt.url(), EDGEPLEX_CP_PLACEMENT_INTERVAL_S="60")
    cp.start()

    def placement_version(admin: pb_grpc.AdminServiceStub) -> int:
        return admin.GetPlacement(pb.PlacementRequest(), metadata=AUTH, timeout=5).version

    async def states_until_acme(admin: pb_grpc.AdminServiceStub) -> tuple[pb.DesiredState, int]:
        async with aiomqtt.Client(**parse_mqtt_url(mqtt.url()).client_kwargs()) as client:  # type: ignore[arg-type]
            await client.subscribe(desired_topic("s1"), qos=1)
            async with asyncio.timeout(10):
                added = False
                async for message in client.messages:
                    body = pb.SignedBody.FromString(
                        pb.SignedMessage.FromString(bytes(message.payload)).body  # type: ignore[arg-type]
                    )
                    payload = zlib.decompress(body.payload) if body.encoding else body.payload
                    state = pb.DesiredState.FromString(payload)
                    if not added:  # the retained state from the site's first round
                        before = placement_version(admin)
                        admin.AddTenant(pb.TenantSpec(name="acme"), metadata=AUTH, timeout=10)
                        added = True
                    elif "acme" in state.tenants_json:
                        return state, before
        raise AssertionError("no desired state came")

    try:
        with grpc.insecure_channel(cp.address) as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            added = admin.AddSite(
                pb.AddSiteRequest(site_id="s1", region="r1"), metadata=AUTH, timeout=10
            )
            pb_grpc.AgentServiceStub(channel).Register(  # a round places it and sends its state
                pb.RegisterRequest(site_id="s1", region="r1", address="127.0.0.1:1"),
                metadata=(("authorization", f"Bearer {added.join_token}"),),
                timeout=10,
            )
            state, before = asyncio.run(states_until_acme(admin))
            assert state.version > before  # newer than the placement it was made on
            assert placement_version(admin) == before  # and no round placed meanwhile
        assert "desired states anew for the tenants" in cp.log()
    finally:
        cp.stop()
        mqtt.stop()
        redis_server.stop()
