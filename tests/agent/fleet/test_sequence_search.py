"""A stateful model's sequence goes on where it began, even when that holder is busy.

A site that does not hold a stateful model forwards each of a sequence's requests
by the routes, which leave out holders with no headroom. When the holder where the
sequence began is busy, a request in its middle reaches another holder, which has
no state for it: that holder answers `edgeplex-sequence-not-here`, and the forwarder
tries the model's other holders, busy ones included, nearest first. Real sockets on
both doors: the peers are aiohttp and grpc.aio servers that answer through the
agent's own error mapping."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
import pytest

from edgeplex.agent.batching.sequences import SequenceNotHere
from edgeplex.agent.fleet.forward import (
    SEQUENCE_NOT_HERE,
    SEQUENCE_SEARCH,
    SEQUENCES_KEPT,
    SERVED_BY,
    GrpcForward,
    HttpForward,
    Peer,
    Router,
    SequenceHint,
)
from edgeplex.agent.fleet.routing import choose_route
from edgeplex.agent.oip.errors import Unavailable
from edgeplex.proto import inference_pb2 as pb
from tests.support.peer_sites import PeerSites, peer_sites

MODEL = "acc"
MISSING = "inference request for sequence 7 to model 'acc' must specify the START flag"
NAMES = [f"s{i}" for i in range(SEQUENCE_SEARCH + 2)]


class Sites:
    """The peer sites, each holding MODEL; those in `keeping` hold the sequence too.
    Every call each site answered is counted."""

    def __init__(self) -> None:
        self.peers = PeerSites(MODEL)  # their ports, once they serve
        self.calls: dict[str, int] = {}
        self.keeping: set[str] = set()
        self.hanging: set[str] = set()  # take the call and never answer it

    async def answer(self, site: str) -> Mapping[str, str]:
        """A site without the sequence refuses it as a forwarded request's holder
        without its state does."""
        self.calls[site] = self.calls.get(site, 0) + 1
        if site in self.hanging:
            await asyncio.sleep(2)  # past every deadline the tests give (1 s)
        if site not in self.keeping:
            raise SequenceNotHere(MISSING)
        return {SERVED_BY: site}


@pytest.fixture
async def sites() -> AsyncIterator[Sites]:
    out = Sites()
    async with peer_sites(MODEL, NAMES, out.answer) as out.peers:
        yield out


def _routed(sites: Sites, headroom: dict[str, float]) -> tuple[Router, list[Peer]]:
    """A router with these routes, and the peers the routing policy sends a request to
    from a site that does not hold the model."""
    router = Router("here", "r")
    assert router.update(sites.peers.routes(headroom))
    route = choose_route(None, router.options(MODEL), forwarded=False)
    return router, router.peers(MODEL, route.peers)


async def _http(router: Router, peers: list[Peer]) -> tuple[int, str, dict[str, str]]:
    status, body, headers = await router.forward_http(
        MODEL, f"/v2/models/{MODEL}/infer", b"{}", {}, peers, "r"
    )
    return status, body.decode(), headers


async def _grpc(router: Router, peers: list[Peer]) -> tuple[int, str, dict[str, str]]:
    try:
        request = pb.ModelInferRequest(model_name=MODEL)
        _, trailers = await router.forward_grpc(request, peers, "r", 5)
    except grpc.aio.AioRpcError as exc:
        marks = {k: str(v) for k, v in exc.trailing_metadata() or ()}
        status = 400 if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else 500
        return status, exc.details(), marks
    return 200, "", dict(trailers)


@pytest.mark.parametrize("door", [_http, _grpc], ids=["http", "grpc"])
async def test_a_sequence_goes_on_at_its_busy_holder(sites: Sites, door: Any) -> None:
    sites.keeping = {"s1"}  # where the sequence began; busy now
    router, peers = _routed(sites, {"s0": 1.0, "s1": 0.0, "s2": 0.5})
    assert [p.site_id for p in peers] == ["s0", "s2"]  # the route leaves the busy one out
    status, _, headers = await door(router, peers)
    assert status == 200 and headers[SERVED_BY] == "s1"
    assert sites.calls == {"s0": 1, "s2": 1, "s1": 1}  # the route's two, then the rest
    # Holding the model without the sequence keeps a site on the model's routes.
    assert [o.site_id for o in router.options(MODEL)] == ["s0", "s1", "s2"]
    await router.close()


@pytest.mark.parametrize("door", [_http, _grpc], ids=["http", "grpc"])
async def test_a_sequence_no_holder_has_fails_as_triton_fails_it(sites: Sites, door: Any) -> None:
    """No holder has the sequence: the caller has the holder's INVALID_ARGUMENT, the
    START flag named, and the search stopped at SEQUENCE_SEARCH holders."""
    router, peers = _routed(sites, {site: 1.0 for site in NAMES})
    status, message, headers = await door(router, peers)
    assert status == 400 and "must specify the START flag" in message
    if door is _http:  # the mark is for forwarders: not passed on to the caller
        assert SEQUENCE_NOT_HERE not in headers
    assert sorted(sites.calls) == sorted(NAMES[:SEQUENCE_SEARCH])
    assert set(sites.calls.values()) == {1}
    await router.close()


async def test_a_search_stays_within_one_deadline(sites: Sites) -> None:
    """Holders that take a forward and never answer share the forward's one
    deadline: the search ends when it passes (not after a full timeout for each),
    with a retryable error, not the START flag's (the sequence may be there)."""
    sites.hanging = {"s1", "s2", "s3"}
    router, peers = _routed(sites, {"s0": 1.0, "s1": 0.0, "s2": 0.0, "s3": 0.0})
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await router.forward_grpc(pb.ModelInferRequest(model_name=MODEL), peers, "r", 1.0)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    started_http = time.monotonic()
    assert started_http - started < 1.8
    path = f"/v2/models/{MODEL}/infer"
    with pytest.raises(Unavailable):  # 503: retry
        await router.forward_http(MODEL, path, b"{}", {}, peers, "r", timeout_s=1.0)
    assert time.monotonic() - started_http < 1.8
    # Each time the deadline passed at the first silent holder; the second time that
    # was s2, s1 having been set aside as down after its silence.
    assert sites.calls == {"s0": 2, "s1": 1, "s2": 1}
    await router.close()


async def _in_sequence_http(router: Router, peers: list[Peer], sequence: int, end: bool) -> str:
    parameters = {"sequence_id": sequence, "sequence_start": False, "sequence_end": end}
    body = json.dumps({"inputs": [], "parameters": parameters}).encode()
    call = HttpForward(MODEL, f"/v2/models/{MODEL}/infer", body, {})
    status, _, headers = await router.forward(call, peers, "r", "")  # type: ignore[misc]
    assert status == 200
    return str(headers[SERVED_BY])


async def _in_sequence_grpc(router: Router, peers: list[Peer], sequence: int, end: bool) -> str:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.parameters["sequence_id"].int64_param = sequence
    request.parameters["sequence_end"].bool_param = end
    _, trailers = await router.forward(GrpcForward(request, 5), peers, "r", "")  # type: ignore[misc]
    return str(dict(trailers)[SERVED_BY])


@pytest.mark.parametrize("door", [_in_sequence_http, _in_sequence_grpc], ids=["http", "grpc"])
async def test_a_sequences_next_requests_go_straight_to_its_holder(sites: Sites, door: Any) -> None:
    """Once a search found the sequence at a busy holder, the sequence's next
    requests go there first: no search each time. Its END forgets it."""
    sites.keeping = {"s1"}  # where the sequence began; busy now
    router, peers = _routed(sites, {"s0": 1.0, "s1": 0.0, "s2": 0.5})
    assert await door(router, peers, 7, end=False) == "s1"
    assert sites.calls == {"s0": 1, "s2": 1, "s1": 1}  # found by the search
    assert await door(router, peers, 7, end=False) == "s1"
    assert await door(router, peers, 7, end=True) == "s1"
    assert sites.calls == {"s0": 1, "s2": 1, "s1": 3}  # straight there
    assert await door(router, peers, 7, end=False) == "s1"  # ended: found by a search again
    assert sites.calls == {"s0": 2, "s2": 2, "s1": 4}
    await router.close()


async def test_the_holders_remembered_are_bounded(sites: Sites) -> None:
    """At most SEQUENCES_KEPT sequences are remembered, the least recently used
    forgotten first."""
    sites.keeping = {"s1"}
    router, peers = _routed(sites, {"s0": 1.0, "s1": 0.0})
    for sequence in range(1, SEQUENCES_KEPT + 2):  # one more than kept: the first goes
        hint = SequenceHint((MODEL, "", str(sequence)), start=False, end=False)
        router._remember(hint, "s1")  # what a served forward records
    assert len(router._sequences) == SEQUENCES_KEPT
    assert await _in_sequence_grpc(router, peers, 2, end=False) == "s1"
    assert sites.calls == {"s1": 1}  # remembered: straight there
    assert await _in_sequence_grpc(router, peers, 1, end=False) == "s1"
    assert sites.calls == {"s1": 2, "s0": 1}  # forgotten: the route first, then the search
    await router.close()
