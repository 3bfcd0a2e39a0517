"""The routing policy: pure, no sockets."""

from __future__ import annotations

from edgeplex.agent.fleet.routing import Local, PeerOption, Where, choose_route

NEAR = PeerOption("near", latency_s=0.005)
FAR = PeerOption("far", latency_s=0.080)


def test_a_loaded_model_is_served_here_whatever_the_peers():
    assert choose_route(Local(True, None), [NEAR], False).where == Where.LOCAL


def test_a_model_whose_live_sequences_are_here_is_served_here():
    """Their state is here: the model is promoted again rather than the sequence's
    next request sent to a peer that has none of it."""
    assert choose_route(Local(False, None, sequences=True), [NEAR], False).where == Where.LOCAL
    assert choose_route(Local(False, None), [NEAR], False).where == Where.FORWARD


def test_a_forwarded_request_is_never_forwarded_again():
    assert choose_route(Local(False, None), [NEAR], True).where == Where.LOCAL
    assert choose_route(None, [NEAR], True).where == Where.NOWHERE


def test_a_quick_local_promotion_beats_a_far_peer():
    assert choose_route(Local(False, 0.004), [FAR], False).where == Where.LOCAL


def test_a_near_peer_beats_a_slow_local_promotion_and_peers_go_nearest_first():
    route = choose_route(Local(False, 0.500), [FAR, NEAR], False)
    assert route.where == Where.FORWARD and route.peers == ("near", "far")


def test_an_unknown_promotion_cost_forwards_to_a_peer_that_holds_the_model():
    route = choose_route(Local(False, None), [FAR], False)
    assert route.where == Where.FORWARD


def test_peers_without_headroom_are_skipped():
    full = PeerOption("full", latency_s=0.001, headroom=0.0)
    assert choose_route(Local(False, None), [full], False).where == Where.LOCAL
    # Not here at all: a busy peer still beats no site.
    assert choose_route(None, [full], False).where == Where.FORWARD


def test_a_peer_in_this_region_goes_before_peers_in_others() -> None:
    """Routes give a peer in the agent's own region 0 ms; the router must read that as
    the nearest peer, not as an unknown distance sorted last (which sent requests
    to another region while a sibling site held the model)."""
    from edgeplex.agent.fleet.forward import Router
    from edgeplex.proto import edgeplex_control_pb2 as cpb

    router = Router("r0s0", "r0")
    targets = [
        cpb.RouteTarget(site_id="r1s0", address="a:1", region="r1", latency_ms=30.0),
        cpb.RouteTarget(site_id="r0s1", address="b:1", region="r0", latency_ms=0.0),
    ]
    routes = cpb.Routes(version=1, region="r0", routes=[cpb.Route(model="m", targets=targets)])
    assert router.update(routes)
    route = choose_route(Local(False, 0.002), router.options("m"), False)
    assert route.where == Where.FORWARD and route.peers == ("r0s1", "r1s0")
