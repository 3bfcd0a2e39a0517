"""Routes carry each holder's headroom, coarsely, so they change only when it moves."""

from __future__ import annotations

from edgeplex.control_plane.planner import site_headroom
from edgeplex.proto import edgeplex_control_pb2 as pb


def report(*utilization: float) -> pb.LoadReport:
    return pb.LoadReport(devices=[pb.DeviceLoad(utilization=u) for u in utilization])


def test_headroom_is_the_busiest_device_left_free_in_tenths():
    headroom = site_headroom({"a": report(0.33, 0.71), "b": report(0.98), "c": report()})
    assert headroom == {"a": 0.3, "b": 0.0, "c": 1.0}


def test_a_route_target_without_a_report_has_no_headroom_field():
    target = pb.RouteTarget(site_id="x", headroom=None)
    assert not target.HasField("headroom")
    assert pb.RouteTarget(site_id="y", headroom=0.0).HasField("headroom")
