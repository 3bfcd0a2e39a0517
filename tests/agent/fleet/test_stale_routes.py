"""A stale routing table costs a hop, never a request.

Routes can reach a site before the model reaches the peer they name (or after it
left). The peer answers `edgeplex-not-here`; the forwarder drops it from the
model's routes and routes the request again. Real sockets on both doors: the
peers are aiohttp and grpc.aio servers that answer through the agent's own
error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from edgeplex.agent.fleet.forward import SERVED_BY, Peer, Router, via_peers
from edgeplex.agent.oip.errors import NotHere
from edgeplex.proto import inference_pb2 as pb
from tests.support.peer_sites import PeerSites, peer_sites

MODEL = "m"


class Peers:
    """Two peer sites on real ports: 'gone' no longer holds MODEL, 'holder' does."""

    def __init__(self) -> None:
        self.sites = PeerSites(MODEL)  # their ports, once they serve
        self.calls: dict[str, int] = {"gone": 0, "holder": 0}

    async def answer(self, site: str) -> Mapping[str, str]:
        self.calls[site] += 1
        if site == "gone":
            raise NotHere(f"model '{MODEL}' is not at this site")
        # How it served travels back through the forwarder too.
        return {SERVED_BY: site, "edgeplex-variant": "int8"}


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    out = Peers()
    async with peer_sites(MODEL, ["gone", "holder"], out.answer) as out.sites:
        yield out


def _router(peers: Peers, *sites: str) -> Router:
    router = Router("here", "r")
    assert router.update(peers.sites.routes(dict.fromkeys(sites)))
    return router


def _route(router: Router) -> Any:
    return lambda: router.peers(MODEL, tuple(o.site_id for o in router.options(MODEL)))


async def _http(router: Router, targets: list[Peer]) -> Any:
    return await router.forward_http(MODEL, f"/v2/models/{MODEL}/infer", b"{}", {}, targets, "r")


async def _grpc(router: Router, targets: list[Peer]) -> Any:
    return await router.forward_grpc(pb.ModelInferRequest(model_name=MODEL), targets, "r", 5.0)


@pytest.mark.parametrize("door", [_http, _grpc], ids=["http", "grpc"])
async def test_a_peer_that_no_longer_holds_the_model_is_skipped(peers: Peers, door: Any) -> None:
    router = _router(peers, "gone", "holder")
    reply = await via_peers(_route(router), lambda t: door(router, t))
    assert reply is not None
    served_by = reply[2]["edgeplex-served-by"] if door is _http else dict(reply[1])[SERVED_BY]
    assert served_by == "holder" and peers.calls == {"gone": 1, "holder": 1}
    if door is _grpc:
        assert dict(reply[1])["edgeplex-variant"] == "int8"
    # Off the model's routes until the next table; not marked down for other models.
    assert [p.site_id for p in router.options(MODEL)] == ["holder"]
    await via_peers(_route(router), lambda t: door(router, t))
    assert peers.calls == {"gone": 1, "holder": 2}
    await router.close()


@pytest.mark.parametrize("door", [_http, _grpc], ids=["http", "grpc"])
async def test_when_no_peer_holds_it_the_request_is_served_here(peers: Peers, door: Any) -> None:
    router = _router(peers, "gone")
    asked: list[int] = []

    def route() -> list[Peer]:
        asked.append(1)
        return _route(router)()

    assert await via_peers(route, lambda t: door(router, t)) is None  # None: serve it here
    assert len(asked) == 2 and peers.calls["gone"] == 1
    await router.close()


async def test_a_newer_table_brings_the_peer_back(peers: Peers) -> None:
    router = _router(peers, "gone", "holder")
    await via_peers(_route(router), lambda t: _http(router, t))
    fresh = peers.sites.routes(dict.fromkeys(("gone", "holder")))
    fresh.version = 2
    assert router.update(fresh)
    assert [p.site_id for p in router.options(MODEL)] == ["gone", "holder"]
    await router.close()
