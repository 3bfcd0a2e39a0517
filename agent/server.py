"""Process entry of `edgeplex agent`: wiring, startup order and shutdown.

Startup order matters: the zygote is exec'd before gRPC or any other thread
starts (fork safety), then the model table, then the front doors, then the
initial loads. The agent is live as soon as the front doors listen and ready
once every model's initial load has ended (READY or FAILED).

SIGTERM (or SIGINT): readiness turns false at once, new requests get
UNAVAILABLE, in-flight requests get up to drain_timeout_s, then the front
doors close, runners and the zygote stop, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from edgeplex.agent.config import AgentSettings
from edgeplex.agent.core import Agent
from edgeplex.agent.grpc_api import start_grpc_server
from edgeplex.agent.http_api import start_http_server
from edgeplex.agent.models import ModelTable
from edgeplex.agent.runners import RunnerPool

log = logging.getLogger("edgeplex.agent")


async def serve(settings: AgentSettings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    table: ModelTable | None = None
    pool = RunnerPool(
        settings.runner,
        settings.log_level,
        on_up=lambda rid: table.runner_up(rid) if table else None,
        on_down=lambda rid: table.runner_down(rid) if table else None,
    )
    await pool.start()
    table = ModelTable(settings, pool)
    names = table.discover()
    agent = Agent(settings, table)
    grpc_server, grpc_port = await start_grpc_server(agent)
    http_runner, http_port = await start_http_server(agent)
    log.info(
        "serving %d models: grpc %s:%d, http %s:%d",
        len(names),
        settings.grpc_host,
        grpc_port,
        settings.http_host,
        http_port,
    )

    async def initial_loads() -> None:
        if settings.load_models_at_start:
            await asyncio.gather(*(table.load(n) for n in names), return_exceptions=True)
        agent.started = True
        log.info("agent ready")

    loader = asyncio.create_task(initial_loads())
    await stop.wait()

    log.info("shutting down: draining in-flight requests (up to %.0f s)", settings.drain_timeout_s)
    agent.draining = True
    drained = await agent.drain(settings.drain_timeout_s)
    if not drained:
        log.warning("drain timeout: some requests did not finish")
    loader.cancel()
    await grpc_server.stop(grace=1.0)
    await http_runner.cleanup()
    await table.stop()
    await pool.stop()
    log.info("stopped")


def run_agent(settings: AgentSettings) -> int:
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings))
    return 0
