"""Process entry of `edgeplex control-plane`: wiring, startup and shutdown.

Tasks, each owning one thing: the leader lease, the placement loop (acts only
on the leader), the report sink (writes reports behind), the MQTT publisher.
gRPC serves AgentService and AdminService on one port; /metrics and /healthz
are on the optional HTTP port. Nothing is kept only in memory that a restart
would miss: a restarted replica reads everything back from Redis.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import signal
import tempfile
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from edgeplex import logs, systemd
from edgeplex.artifacts import ArtifactCache, FetchPolicy
from edgeplex.control_plane.api_admin import AdminServicer, TokenAuth
from edgeplex.control_plane.api_agent import AgentServicer, CredentialWatch, ReportSink
from edgeplex.control_plane.batch import BatchRunner
from edgeplex.control_plane.broker_files import BrokerFiles
from edgeplex.control_plane.config import ControlPlaneSettings
from edgeplex.control_plane.dashboard import Dashboard
from edgeplex.control_plane.leader import LeaderLease
from edgeplex.control_plane.metrics import METRICS
from edgeplex.control_plane.planner import Planner
from edgeplex.control_plane.publisher import Publisher
from edgeplex.control_plane.redis_client import connect
from edgeplex.control_plane.store import Store
from edgeplex.net import grpc_silence_options, is_loopback
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.settings import state_dir
from edgeplex.signing import Signer

log = logging.getLogger("edgeplex.control_plane")
USAGE_UPKEEP_S = 60.0  # how often the leader seals and drops usage hours
# A report stream whose agent vanished (its link cut, its box gone without a FIN)
# sends nothing, and the replica sends nothing on it until it ends: left alone, it
# stays open, with its connection, until gRPC's default keepalive of two hours. The
# replica pings a connection with calls on it after AGENT_PING_AFTER_S without a
# frame from the agent (reports come every 2 s by default), and closes it once a
# ping stays unacknowledged for AGENT_SILENCE_S.
AGENT_PING_AFTER_S, AGENT_SILENCE_S = 10.0, 5.0


def check_binds(settings: ControlPlaneSettings) -> None:
    """Refuse to serve beyond loopback in clear text unless told `insecure`: gRPC
    carries join tokens and the admin token, the HTTP port the dashboard's."""
    exposed = []
    if not is_loopback(settings.grpc_host) and settings.tls_cert is None:
        exposed.append(f"gRPC on {settings.grpc_host or '*'}")
    if settings.http_port is not None and not is_loopback(settings.http_host):
        exposed.append(f"HTTP on {settings.http_host or '*'}")
    if exposed and not settings.insecure:
        raise ValueError(
            f"refusing to serve {' and '.join(exposed)} without TLS: set tls_cert and "
            "tls_key (gRPC), keep http_host on loopback, or pass --insecure on a network "
            "you trust"
        )


def server_credentials(settings: ControlPlaneSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    ca = settings.tls_client_ca.read_bytes() if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


async def serve(settings: ControlPlaneSettings, stop: asyncio.Event | None = None) -> None:
    if not settings.admin_token:
        raise RuntimeError("an admin token is required: set EDGEPLEX_ADMIN_TOKEN (or admin_token)")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    check_binds(settings)
    artifact_dir = settings.artifact_dir or Path(tempfile.mkdtemp(prefix="edgeplex-cp-artifacts-"))
    store = Store(settings.redis_url, settings.redis_wait_replicas, settings.redis_wait_ms)
    # Its own connection, used and closed on the lease's own thread (leader.py).
    lease = LeaderLease(connect(store.url, 1)[0], settings.replica_id, settings.leader_lease_s)
    signer = Signer.from_file(settings.signing_key_file or state_dir() / "signing-key")
    log.info(
        "signing control messages with key %s (public key %s)",
        signer.key_id,
        base64.b64encode(signer.public).decode(),
    )
    publisher = Publisher(
        settings.mqtt_url,
        f"edgeplex-cp-{settings.replica_id}",
        signer,
        settings.message_ttl_s,
        settings.mqtt_tls_ca,
        settings.message_compression,
    )
    planner = Planner(settings, store, publisher, lease)
    sink = ReportSink(store)
    token_watch = CredentialWatch(store)
    admin = AdminServicer(
        store,
        planner,
        ArtifactCache(
            artifact_dir,
            settings.max_artifact_bytes,
            FetchPolicy.of(settings),
        ),
        planner.poke,
        BrokerFiles(
            settings.mqtt_password_file,
            settings.mqtt_acl_file,
            settings.mqtt_pid_file,
            settings.mqtt_cp_user,
            settings.mqtt_bridge_users,
        )
        if settings.mqtt_password_file and settings.mqtt_acl_file
        else None,
    )

    server = grpc.aio.server(
        interceptors=[TokenAuth(settings.admin_token, settings.batch_token, settings.read_token)],
        options=[
            ("grpc.so_reuseport", 0),
            *grpc_silence_options(AGENT_SILENCE_S, ping_after_s=AGENT_PING_AFTER_S),
            # However long a stream it only reads stays quiet: gRPC stops pinging
            # after two pings with no frame of its own sent, by default.
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )
    pb_grpc.add_AgentServiceServicer_to_server(
        AgentServicer(settings, store, sink, token_watch, planner.poke, signer), server
    )
    pb_grpc.add_AdminServiceServicer_to_server(admin, server)
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    credentials = server_credentials(settings)
    port = (
        server.add_secure_port(address, credentials)
        if credentials
        else server.add_insecure_port(address)
    )
    if port == 0:
        raise OSError(f"cannot listen on {address} (in use?)")
    await server.start()

    http_runner = None
    if settings.http_port is not None:
        dashboard = Dashboard(store, planner, settings.admin_token or "", planner.poke)
        http_runner = await _start_http(settings, store, lease, dashboard)

    async def follow_leadership() -> None:
        while True:
            await lease.changed.wait()
            lease.changed.clear()
            METRICS.leader.set(1 if lease.is_leader else 0)
            publisher.set_active(lease.is_leader)
            if lease.is_leader:
                with contextlib.suppress(Exception):
                    await admin.verify_pending()
                planner.poke()

    async def keep_usage() -> None:
        """Once a minute the leader seals the usage hours whose minutes are kept no
        longer and drops the hours past keeping (a replica that comes to lead does
        so within a second). Minutes an earlier version kept in one hash move into
        their hours first (any replica; moving is idempotent)."""
        migrated = False
        while True:
            wait = 1.0  # until this replica leads
            try:
                if not migrated:
                    moved = await store.usage.migrate()
                    if moved:
                        log.info("moved %d usage minutes into their hourly sums", moved)
                    if days := await store.usage.list_days_to_sum():
                        log.info("usage: %d site-days listed to be summed", days)
                    migrated = True
                if lease.is_leader:
                    wait = USAGE_UPKEEP_S
                    sealed, dropped = await store.usage.trim(
                        time.time(),
                        settings.usage_minutes_kept_h * 3600,
                        settings.usage_kept_days * 86400,
                    )
                    if sealed or dropped:
                        log.info("usage: %d site-hours sealed, %d dropped", sealed, dropped)
            except RedisError as exc:
                log.warning("usage upkeep waits for Redis: %s", exc)
            except Exception:  # a bug must not end the upkeep for good: said, tried again
                log.exception("usage upkeep failed; trying again in %.0f s", wait)
            await asyncio.sleep(wait)

    batches = BatchRunner(store, lease, settings.region_clock_offset_h)
    tasks = [
        asyncio.create_task(lease.run_on_thread(), name="the leader lease"),
        asyncio.create_task(batches.run(), name="batch jobs"),
        asyncio.create_task(planner.run(), name="placement"),
        asyncio.create_task(sink.run(), name="the report sink"),
        asyncio.create_task(token_watch.run(), name="the token watch"),
        asyncio.create_task(publisher.run(), name="the MQTT publisher"),
        asyncio.create_task(follow_leadership(), name="leadership"),
        asyncio.create_task(keep_usage(), name="usage upkeep"),
        asyncio.create_task(systemd.watchdog(), name="the systemd watchdog"),
    ]
    log.info(
        "control plane %s serving gRPC on %s:%d%s",
        settings.replica_id,
        settings.grpc_host,
        port,
        " (TLS)" if credentials else "",
    )
    print(f"edgeplex control-plane listening grpc={port}", flush=True)
    systemd.notify("READY=1", f"STATUS=serving gRPC on port {port}")
    await stop.wait()
    systemd.notify("STOPPING=1")

    # Each step of the stop is bounded, and one cut off is named in the log: the
    # whole stop takes at most 12 s (with _close), inside a unit's stop timeout.
    log.info("shutting down")
    await _within("the gRPC server's stop", server.stop(grace=2.0), 3.0)
    await _within("the report sink's last writes", sink.flush(), 2.0)
    await _within("the leader lease's release", lease.release(), 1.0)
    await _cancel(tasks, 3.0)
    if http_runner is not None:
        await _within("the HTTP server's cleanup", http_runner.cleanup(), 1.0)
    await _within("closing Redis", store.close(), 1.0)
    log.info("stopped")


async def _cancel(tasks: Iterable[asyncio.Task[Any]], timeout_s: float) -> None:
    """Cancel `tasks` and give them `timeout_s` to end; those that do not are named
    in the log and left."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, running = await asyncio.wait(tasks, timeout=timeout_s)
    if running:
        names = ", ".join(sorted(task.get_name() for task in running))
        log.warning("shutdown: %s did not end when cancelled; stopping without it", names)


async def _within(step: str, work: Awaitable[object], timeout_s: float) -> None:
    """One step of the stop, given `timeout_s`: a step that takes longer is left
    (cancelled, not waited for) and named in the log, as is one that fails."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait([task], timeout=timeout_s)
    if not done:
        task.cancel()
        log.warning("shutdown: %s took over %g s; stopping without it", step, timeout_s)
    elif not task.cancelled() and task.exception() is not None:
        log.warning("shutdown: %s failed: %s", step, task.exception())


async def _start_http(
    settings: ControlPlaneSettings, store: Store, lease: LeaderLease, dashboard: Dashboard
) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(METRICS.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(request: web.Request) -> web.Response:
        try:
            await store.ping()
        except Exception:
            return web.json_response({"redis": False, "leader": lease.is_leader}, status=503)
        return web.json_response({"redis": True, "leader": lease.is_leader})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_routes(dashboard.routes())
    sampler = asyncio.create_task(dashboard.sample())

    async def stop_sampler(_app: web.Application) -> None:
        sampler.cancel()

    app.on_cleanup.append(stop_sampler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.http_host, settings.http_port).start()
    return runner


def _log_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task died", exc_info=task.exception())


def run_control_plane(settings: ControlPlaneSettings) -> int:
    logs.configure(settings.log_level, settings.log_format)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(settings))
    except KeyboardInterrupt:
        pass
    except (OSError, RuntimeError, ValueError) as exc:
        log.error("edgeplex control-plane cannot start: %s", exc)
        return 1
    finally:
        _close(loop)
    return 0


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio.run's close, bounded: the tasks still running are cancelled and given
    a second; one that does not end is named and left, and the process exits."""
    loop.run_until_complete(_cancel(asyncio.all_tasks(loop), 1.0))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    asyncio.set_event_loop(None)
    loop.close()
