"""A link cut under a kept connection costs seconds, not the request's deadline.

The forwarder keeps its connections to peers. When the link to one is cut (no
reset, no FIN: the peer's packets just stop), a request written on the kept
connection is never acknowledged; without a bound it waits out its whole deadline
(a minute over HTTP) while the next holder stands idle. The forwarder's sockets
give up after PEER_SILENCE_S unacknowledged (TCP_USER_TIMEOUT), mark the peer
down and try the next holder. The cut is real: iptables drops what reaches the
peer's port on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import pytest

from edgeplex.agent.fleet.forward import PEER_SILENCE_S, SERVED_BY, Router
from edgeplex.proto import inference_pb2 as pb
from tests.support.netcut import cut, needs_cut
from tests.support.peer_sites import peer_sites

MODEL = "m"

pytestmark = needs_cut


async def _served_by(site: str) -> Mapping[str, str]:
    return {SERVED_BY: site}


async def _http(router: Router) -> str:
    targets = router.peers(MODEL, ("near", "far"))
    path = f"/v2/models/{MODEL}/infer"
    _, _, headers = await router.forward_http(MODEL, path, b"{}", {}, targets, "r")
    return headers[SERVED_BY]


async def _grpc(router: Router) -> str:
    targets = router.peers(MODEL, ("near", "far"))
    request = pb.ModelInferRequest(model_name=MODEL)
    _, trailers = await router.forward_grpc(request, targets, "r", 30.0)
    return dict(trailers)[SERVED_BY]


@pytest.mark.parametrize("door", ["http", "grpc"])
async def test_a_cut_link_fails_over_to_the_next_holder_in_seconds(door: str) -> None:
    forward = {"http": _http, "grpc": _grpc}[door]
    async with peer_sites(MODEL, ["near", "far"], _served_by) as sites:
        router = Router("here", "r")
        assert router.update(sites.routes({"near": None, "far": None}))
        try:
            assert await forward(router) == "near"  # the connection is kept
            with cut(getattr(sites, door)["near"]):
                started = time.monotonic()
                served_by = await asyncio.wait_for(forward(router), 30)
                took = time.monotonic() - started
            assert served_by == "far"
            assert took <= PEER_SILENCE_S + 2, took
            # ...and the cut peer is set aside: the next requests go to "far" at once.
            assert [p.site_id for p in router.holders(MODEL)] == ["far"]
        finally:
            await router.close()
