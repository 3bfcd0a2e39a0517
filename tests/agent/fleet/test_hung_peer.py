"""A peer that is reachable but hung: its process stopped (SIGSTOP), so its kernel
still accepts the connection and acknowledges every byte, and no timeout of TCP's
fires. A forward it leaves unanswered for PROBE_AFTER_S has the peer asked whether it
is live; no answer within PROBE_TIMEOUT_S, and the forward goes to the next holder.
A peer that answers the question is only slow, and the forward waits for it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from edgeplex.agent.catalog import demo
from edgeplex.agent.fleet.forward import (
    PROBE_AFTER_S,
    PROBE_TIMEOUT_S,
    SERVED_BY,
    Peer,
    Router,
)
from edgeplex.agent.oip.errors import Unavailable
from edgeplex.proto import edgeplex_control_pb2 as cpb
from edgeplex.proto import inference_pb2 as pb
from tests.conftest import AgentProcess, start_agent
from tests.support.peer_sites import peer_sites

pytestmark = pytest.mark.slow
MODEL = "mlp"


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, AgentProcess]]:
    """Two agents serving MODEL: "hung" (stopped by the tests that need it) and "live"."""
    work = tmp_path_factory.mktemp("hung-peer")
    demo.make_mlp(work / "repo" / MODEL, width=16, layers=1, in_width=8)
    started = {site: start_agent(work / "repo", work) for site in ("hung", "live")}
    yield started
    for agent in started.values():
        os.kill(agent.process.pid, signal.SIGCONT)
        agent.stop()


def _router(agents: Mapping[str, AgentProcess], order: list[str]) -> tuple[Router, list[Peer]]:
    targets = [
        cpb.RouteTarget(
            site_id=site, address=agents[site].grpc_url, http_address=agents[site].http_url,
            region="r", latency_ms=float(i),
        )
        for i, site in enumerate(order)
    ]  # fmt: skip
    router = Router("here", "r")
    router.update(
        cpb.Routes(version=1, region="r", routes=[cpb.Route(model=MODEL, targets=targets)])
    )
    return router, router.holders(MODEL)


def _request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(np.ones((1, 8), np.float32).tobytes())
    return request


def _json_body() -> bytes:
    tensor = {"name": "input", "shape": [1, 8], "datatype": "FP32", "data": [1.0] * 8}
    return json.dumps({"inputs": [tensor]}).encode()


async def _both_doors(router: Router, peers: list[Peer]) -> list[tuple[str, float]]:
    """Who served a gRPC forward and an HTTP forward, and how long each took."""
    out = []
    started = time.monotonic()
    _, trailers = await router.forward_grpc(_request(), peers, "r", 10)
    out.append((dict(trailers)[SERVED_BY], time.monotonic() - started))
    started = time.monotonic()
    status, body, headers = await router.forward_http(
        MODEL, f"/v2/models/{MODEL}/infer", _json_body(), {}, peers, "r", timeout_s=10
    )
    assert status == 200, body
    out.append((headers[SERVED_BY], time.monotonic() - started))
    return out


def test_a_forward_leaves_a_hung_peer_for_the_next_holder(agents: dict[str, AgentProcess]) -> None:
    async def scenario() -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        router, peers = _router(agents, ["hung", "live"])
        try:
            os.kill(agents["hung"].process.pid, signal.SIGSTOP)
            first = await _both_doors(router, peers)
            # The hung peer is skipped meanwhile: the next forwards go straight on.
            router_peers = router.holders(MODEL)
            again = await _both_doors(router, router_peers)
        finally:
            os.kill(agents["hung"].process.pid, signal.SIGCONT)
            await router.close()
        assert [p.site_id for p in router_peers] == ["live"]
        return first, again

    first, again = asyncio.run(scenario())
    bound = PROBE_AFTER_S + PROBE_TIMEOUT_S + 1.0
    # Each door's first forward waited out the question once, then went on.
    assert [site for site, _ in first] == ["live", "live"]
    assert first[0][1] < bound, first
    assert [site for site, _ in again] == ["live", "live"]
    assert all(took < 0.5 for _, took in again), again


def test_a_forward_to_a_hung_peer_alone_fails_soon_as_unavailable(
    agents: dict[str, AgentProcess],
) -> None:
    async def scenario() -> tuple[BaseException | None, float]:
        router, peers = _router(agents, ["hung"])
        started = time.monotonic()
        os.kill(agents["hung"].process.pid, signal.SIGSTOP)
        try:
            await router.forward_grpc(_request(), peers, "r", 10)
        except Unavailable as exc:
            return exc, time.monotonic() - started
        finally:
            os.kill(agents["hung"].process.pid, signal.SIGCONT)
            await router.close()
        return None, time.monotonic() - started

    error, took = asyncio.run(scenario())
    assert error is not None and "did not answer whether it is live" in str(error)
    assert error.retry_after_s is not None
    assert took < PROBE_AFTER_S + PROBE_TIMEOUT_S + 1.0


def test_a_slow_peer_that_answers_whether_it_is_live_is_waited_for() -> None:
    """A long inference (a peer that takes 2.5 s to answer, and answers the liveness
    question at once) is not taken for a hang: one call, its answer."""
    calls: dict[str, int] = {}

    async def answer(site: str) -> Mapping[str, str]:
        calls[site] = calls.get(site, 0) + 1
        await asyncio.sleep(PROBE_AFTER_S * 2.5)
        return {SERVED_BY: site}

    async def scenario() -> str:
        async with peer_sites(MODEL, ["slow", "other"], answer) as sites:
            router = Router("here", "r")
            router.update(sites.routes({"slow": 1.0, "other": 1.0}))
            try:
                _, trailers = await router.forward_grpc(
                    pb.ModelInferRequest(model_name=MODEL), router.holders(MODEL), "r", 10
                )
            finally:
                await router.close()
            return dict(trailers)[SERVED_BY]

    assert asyncio.run(scenario()) == "slow"
    assert calls == {"slow": 1}
