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
