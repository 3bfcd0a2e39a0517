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
import os
import resource
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

from edgeplex import logs, systemd
from edgeplex.agent.batching.queues import Queues
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.core import Agent, rate_limiter, usage_journal
from edgeplex.agent.fleet.forward import Router
from edgeplex.agent.fleet.link import FleetLink, check_first_contact
from edgeplex.agent.frontdoor.auth import Credentials, check_binds, tls_credentials
from edgeplex.agent.frontdoor.grpc import start_grpc_server
from edgeplex.agent.frontdoor.http import start_http_server
from edgeplex.agent.observability.access_log import ACCESS
from edgeplex.agent.observability.tracing import Spans
from edgeplex.agent.residency.contract import Limits
from edgeplex.agent.residency.effects import RunnerEffects
from edgeplex.agent.residency.owner import Residency
from edgeplex.agent.residency.state import ModelRecord
from edgeplex.agent.runners import leftovers
from edgeplex.agent.runners.shm import shm_dir
from edgeplex.agent.runners.supervisor import RunnerPool
from edgeplex.agent.runners.view import runner_view, shared_runner_limit
from edgeplex.eviction import make_policy

log = logging.getLogger("edgeplex.agent")

FLUSH_LINGER_S = 0.5


async def serve(settings: AgentSettings, stop: asyncio.Event | None = None) -> None:
    fleet = settings.fleet
    if fleet.control_plane and not (fleet.site_id and fleet.region and fleet.mqtt_url):
        raise ValueError("joining a fleet needs --site-id, --region and --mqtt")
    check_first_contact(fleet)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    residency: Residency | None = None
    leftovers.sweep([shm_dir(), Path(tempfile.gettempdir())])  # what dead agents left
    staging = make_staging_root(settings)
    pool = RunnerPool(
        settings.runner,
        settings.log_level,
        on_up=lambda rid: residency.runner_up(rid) if residency else None,
        on_down=lambda rid, why: residency.runner_down(rid, why) if residency else None,
        log_format=settings.log_format,
        view=lambda: runner_view(settings, staging),
        shared_limit=shared_runner_limit(settings),
    )
    try:
        await pool.start()
        queues = Queues(pool, usage_journal(settings), rate_limiter(settings))
        effects = RunnerEffects(settings, pool, queues, staging)
        residency = build_residency(settings, effects)
        agent = Agent(settings, residency, queues, pool, effects.promotions)
        names = agent.discover()
        if settings.fleet.control_plane:
            ca = settings.fleet.peer_tls_ca
            agent.router = Router(
                settings.fleet.site_id, settings.fleet.region, ca.read_bytes() if ca else None
            )
        security = settings.security
        metrics = [settings.metrics_host] if settings.metrics_port is not None else []
        check_binds(settings.grpc_host, settings.http_host, *metrics, security=security)
        explicit = settings.model_control_mode == "explicit"
        credentials = Credentials.from_settings(security, agent.tenants, loopback_control=explicit)
        tls = tls_credentials(security)
        grpc_tls = (tls[1], tls[2]) if tls else None
        grpc_server, grpc_port = await start_grpc_server(agent, credentials, grpc_tls)
        http_runner, http_port = await start_http_server(agent, credentials, tls and tls[0])
        metrics_runner = None
        if settings.metrics_port is not None:
            metrics_runner, metrics_port = await start_http_server(
                agent, credentials, tls and tls[0], metrics_only=True
            )
            log.info("metrics: http %s:%d/metrics", settings.metrics_host, metrics_port)
    except BaseException:
        await pool.stop()
        if settings.staging_dir is None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info(
        "serving %d models: grpc %s:%d, http %s:%d",
        len(names),
        settings.grpc_host,
        grpc_port,
        settings.http_host,
        http_port,
    )

    async def initial_loads() -> None:
        # Pinned models always; the others while they fit without evicting anything.
        # The rest stay cached and load on their first request.
        explicit = settings.model_control_mode == "explicit"
        for record in startup_order(residency):
            if explicit:  # only what load_model names; the rest wait for a load
                if "*" in settings.load_model or record.name in settings.load_model:
                    with contextlib.suppress(Exception):
                        await agent.load(record.name)
                continue
            if record.pinned or (
                settings.load_models_at_start
                and residency.ledger.fits_without_eviction(
                    record.name, settings.device_memory_budget
                )
            ):
                with contextlib.suppress(Exception):
                    await agent.load(record.name)
        agent.started = True
        log.info("agent ready")
        systemd.notify("READY=1", f"STATUS=serving {len(residency.records())} models")
        if settings.prestage:
            # Everything else goes to host RAM now, so its first request pays a
            # staged promotion (~memcpy) instead of read + optimize.
            for record in startup_order(residency):
                if not record.disabled:
                    residency.stage(record.name)
                await asyncio.sleep(0)

    async def poll() -> None:  # model_control_mode poll: Triton's repository polling
        while True:
            await asyncio.sleep(settings.repository_poll_secs)
            try:
                await agent.poll()
            except Exception:
                log.exception("repository poll failed")

    async def ticks() -> None:
        while True:
            await asyncio.sleep(0.1)
            residency.tick()

    loader = asyncio.create_task(initial_loads())
    scaler = asyncio.create_task(ticks())
    poller = asyncio.create_task(poll()) if settings.model_control_mode == "poll" else None
    tenants_file = settings.security.tenants_file
    tenant_watch = asyncio.create_task(agent.tenants.follow(tenants_file)) if tenants_file else None
    overload = asyncio.create_task(agent.overload.run())
    watchdog = asyncio.create_task(systemd.watchdog())
    link_task = None
    if settings.fleet.control_plane:
        link = FleetLink(settings, agent, grpc_port, http_port)
        link_task = asyncio.create_task(link.run())
        log.info(
            "fleet: site %s in %s, control plane %s",
            settings.fleet.site_id,
            settings.fleet.region,
            settings.fleet.control_plane,
        )
    await stop.wait()

    log.info("shutting down: draining in-flight requests (up to %.0f s)", settings.drain_timeout_s)
    agent.draining = True
    systemd.notify("STOPPING=1")
    busy = agent.inflight > 0
    drained = await agent.drain(settings.drain_timeout_s)
    if not drained:
        log.warning("drain timeout: some requests did not finish")
    if busy:
        # The last answers are still being encoded and written: closing the
        # connections now could reset them mid-response (seen with 8 MB outputs).
        await asyncio.sleep(FLUSH_LINGER_S)
    loader.cancel()
    scaler.cancel()
    for task in (poller, tenant_watch):
        if task is not None:
            task.cancel()
    overload.cancel()
    watchdog.cancel()
    if link_task is not None:
        link_task.cancel()
    if agent.router is not None:
        await agent.router.close()
    # Responses still being written (an 8 MB tensor to a slow client) get the rest
    # of the drain time; stop() returns as soon as they are done.
    await grpc_server.stop(grace=max(1.0, settings.drain_timeout_s))
    await http_runner.cleanup()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    await queues.stop()
    await effects.stop()
    await pool.stop()
    if settings.staging_dir is None:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("stopped")


def build_residency(settings: AgentSettings, effects: RunnerEffects) -> Residency:
    policy = make_policy(
        settings.eviction_policy,
        lru_max_models=settings.lru_max_models,
        idle_ttl_s=settings.idle_ttl_s,
    )
    limits = Limits(
        device_budget=settings.device_memory_budget,
        host_budget=settings.host_memory_budget,
        max_pending_loads=settings.max_pending_loads,
        max_promotions=settings.max_promotions,
        prepack=settings.runner.prepack_weights,
        prepack_after_s=settings.runner.prepack_after_s,
        hot_share=settings.hot_share,
        sequence_drain_s=settings.sequence_drain_s,
    )
    residency = Residency(limits, policy, effects)
    effects.attach(residency)
    return residency


def startup_order(residency: Residency) -> list[ModelRecord]:
    """Pinned models first, then by priority, then by name."""

    def key(r: ModelRecord) -> tuple[bool, int, str]:
        priority = r.source.config.priority if r.source.config else 0
        return (not r.pinned, -priority, r.name)

    return sorted(residency.records(), key=key)


def make_staging_root(settings: AgentSettings) -> Path:
    """The staged tier's directory: in host RAM (tmpfs), private to this agent."""
    if settings.staging_dir is not None:
        settings.staging_dir.mkdir(parents=True, exist_ok=True)
        return settings.staging_dir
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    if parent is None:
        log.warning("no writable /dev/shm: staged models live in the temp directory")
    root = Path(tempfile.mkdtemp(prefix=f"{leftovers.STAGED}{os.getpid()}-", dir=parent))
    leftovers.claim(root)
    return root


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop for `auto` (when installed) and `uvloop`; None: asyncio's own."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError("event_loop is uvloop, but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def raise_open_files(wanted: int) -> None:
    """Raise this process's soft limit on open files towards `wanted` (within the hard
    limit), so the doors' connection caps bind before the descriptor limit does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_agent(settings: AgentSettings) -> int:
    logs.configure(settings.log_level, settings.log_format)
    # Both doors at their cap, runners, model files and a margin.
    raise_open_files(2 * settings.doors.max_connections + 1024)
    spans = None
    try:
        if settings.otlp_endpoint:
            spans = Spans(settings.otlp_endpoint, "edgeplex-agent", settings.fleet.site_id)
        ACCESS.configure(settings.access_log_rate, spans)
        factory = loop_factory(settings.event_loop)
        log.info("event loop: %s", "uvloop" if factory is not None else "asyncio")
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(settings))
    except KeyboardInterrupt:
        pass
    except (OSError, RuntimeError, ValueError) as exc:  # a port in use, no repository
        log.error("edgeplex agent cannot start: %s", exc)
        return 1
    finally:
        if spans is not None:
            spans.close()  # what is queued goes out
    return 0
