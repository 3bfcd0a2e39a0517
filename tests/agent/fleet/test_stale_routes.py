"""A stale routing table costs a hop, never a request.

Routes can reach a site before the model reaches the peer they name (or after it
left). The peer answers `edgeplex-not-here`; the forwarder drops it from the
model's routes and routes the request again. Real sockets on both doors: the
peers are aiohttp and grpc.aio servers that answer through the agent's own
error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from aiohttp import web

from edgeplex.agent.fleet.forward import SERVED_BY, Peer, Router, via_peers
from edgeplex.agent.frontdoor.grpc import _serve_errors
from edgeplex.agent.frontdoor.http import error_response
from edgeplex.agent.oip.errors import NotHere
from edgeplex.proto import edgeplex_control_pb2 as cpb
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import free_port

MODEL = "m"


class Peers:
    """Two peer sites on real ports: 'gone' no longer holds MODEL, 'holder' does."""

    def __init__(self) -> None:
        self.http: dict[str, int] = {}
        self.grpc: dict[str, int] = {}
        self.calls: dict[str, int] = {"gone": 0, "holder": 0}

    def routes(self, *sites: str) -> cpb.Routes:
        targets = [
            cpb.RouteTarget(
                site_id=s,
                address=f"127.0.0.1:{self.grpc[s]}",
                http_address=f"127.0.0.1:{self.http[s]}",
                region="r",
                latency_ms=0.0,
            )
            for s in sites
        ]
        return cpb.Routes(version=1, region="r", routes=[cpb.Route(model=MODEL, targets=targets)])


def _http_app(peers: Peers, site: str) -> web.Application:
    async def infer(request: web.Request) -> web.Response:
        peers.calls[site] += 1
        if site == "gone":
            return error_response(NotHere(f"model '{MODEL}' is not at this site"))
        return web.json_response({"model_name": MODEL}, headers={"edgeplex-served-by": site})

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


class _Infer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, peers: Peers, site: str) -> None:
        self.peers, self.site = peers, site

    @_serve_errors
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        self.peers.calls[self.site] += 1
        if self.site == "gone":
            raise NotHere(f"model '{MODEL}' is not at this site")
        # How it served travels back through the forwarder too.
        context.set_trailing_metadata(
            (("edgeplex-served-by", self.site), ("edgeplex-variant", "int8"))
        )
        return pb.ModelInferResponse(model_name=MODEL)


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    out = Peers()
    runners, servers = [], []
    for site in ("gone", "holder"):
        runner = web.AppRunner(_http_app(out, site))
        await runner.setup()
        out.http[site] = free_port()
        await web.TCPSite(runner, "127.0.0.1", out.http[site]).start()
        runners.append(runner)
        server = grpc.aio.server()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Infer(out, site), server)
        out.grpc[site] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
    yield out
    for runner in runners:
        await runner.cleanup()
    for server in servers:
        await server.stop(None)


def _router(peers: Peers, *sites: str) -> Router:
    router = Router("here", "r")
    assert router.update(peers.routes(*sites))
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
    fresh = peers.routes("gone", "holder")
    fresh.version = 2
    assert router.update(fresh)
    assert [p.site_id for p in router.options(MODEL)] == ["gone", "holder"]
    await router.close()
