"""Peer sites faked on real loopback ports, for tests of forwarding: each serves
ModelInfer on both doors (an aiohttp app and a grpc.aio server) and answers as the
test's `answer` decides, errors through the agent's own mapping (the doors'
`error_response` and `_serve_errors`), so the forwarder reads them as it reads a
real agent's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web

from edgeplex.agent.frontdoor.grpc import _serve_errors
from edgeplex.agent.frontdoor.http import error_response
from edgeplex.agent.oip.errors import ServeError
from edgeplex.proto import edgeplex_control_pb2 as cpb
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc

# A site's answer to an inference call: the headers (HTTP) or trailers (gRPC) to
# send back with a served response; raise a ServeError to refuse it.
Answer = Callable[[str], Awaitable[Mapping[str, str]]]


@dataclass
class PeerSites:
    """The sites' ports, and routes to them for one model."""

    model: str
    http: dict[str, int] = field(default_factory=dict)
    grpc: dict[str, int] = field(default_factory=dict)

    def routes(self, headroom: Mapping[str, float | None]) -> cpb.Routes:
        """Routes to the sites named, nearest first in the order given, each with its
        headroom (None: not reported)."""
        targets = [
            cpb.RouteTarget(
                site_id=site,
                address=f"127.0.0.1:{self.grpc[site]}",
                http_address=f"127.0.0.1:{self.http[site]}",
                region="r",
                latency_ms=float(i),
                headroom=free,
            )
            for i, (site, free) in enumerate(headroom.items())
        ]
        route = cpb.Route(model=self.model, targets=targets)
        return cpb.Routes(version=1, region="r", routes=[route])


def _http_app(model: str, site: str, answer: Answer) -> web.Application:
    async def infer(request: web.Request) -> web.Response:
        try:
            headers = await answer(site)
        except ServeError as exc:
            return error_response(exc)
        return web.json_response({"model_name": model}, headers=dict(headers))

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


class _Infer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, model: str, site: str, answer: Answer) -> None:
        self.model, self.site, self.answer = model, site, answer

    @_serve_errors
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        trailers = await self.answer(self.site)
        context.set_trailing_metadata(tuple(trailers.items()))
        return pb.ModelInferResponse(model_name=self.model)


@contextlib.asynccontextmanager
async def peer_sites(model: str, names: list[str], answer: Answer) -> AsyncIterator[PeerSites]:
    """Sites `names`, serving until the block ends."""
    sites = PeerSites(model)
    runners: list[web.AppRunner] = []
    servers: list[grpc.aio.Server] = []
    try:
        for site in names:
            runner = web.AppRunner(_http_app(model, site, answer))
            await runner.setup()
            runners.append(runner)
            tcp = web.TCPSite(runner, "127.0.0.1", 0)
            await tcp.start()
            sites.http[site] = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            server = grpc.aio.server()
            pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Infer(model, site, answer), server)
            sites.grpc[site] = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
        yield sites
    finally:
        for runner in runners:
            await runner.cleanup()
        for server in servers:
            await server.stop(None)
