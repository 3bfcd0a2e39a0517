"""The agent's link to the fleet: register and report over gRPC, desired state
over MQTT. Started by server.py when `fleet.control_plane` is set.

Three tasks, each owning one connection or one job:

- `_control_loop`: Register, then one Report stream that sends a LoadReport
  every report interval. FAILED_PRECONDITION (the control plane lost the
  registration, e.g. Redis was wiped) registers again; any other failure
  reconnects after a jittered backoff, to the next control-plane replica. A
  replica the link to which is cut (reports sent and never acknowledged) counts
  as failed after CONTROL_PLANE_SILENCE_S, well within the site lease, so the
  site moves to another replica before it is marked down.
- `_mqtt_loop`: subscribes to the site's desired-state topic, its region's
  routes and the fleet's key topic (QoS 1) with a last-will `offline` on its
  presence topic and a retained `online` after each connect; hands every
  message to `ControlMessages` (control_messages.py), which verifies its
  signature before the reconciler or the router see it; reconnects with
  jittered backoff. The broker's retained messages bring the agent up to
  date after a reconnect.

Register and Report carry the site's join token (`authorization` metadata)
when one is configured; the registration's reply names the key the control
plane signs with, which the agent pins when it trusts none yet.
- the reconciler's `run` (reconcile.py).

A request for a model no site holds asks the control plane for its catalog
entry and loads it here (on_demand.py).

Nothing here stops the agent from serving: while the control plane, Redis or
the broker are down, the agent keeps its last applied state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import aiomqtt
import grpc

from edgeplex import __version__
from edgeplex.agent.catalog.forms import guard_summary
from edgeplex.agent.fleet import usage_shipper
from edgeplex.agent.fleet.control_messages import ControlMessages
from edgeplex.agent.fleet.on_demand import OnDemand
from edgeplex.agent.fleet.reconcile import Reconciler
from edgeplex.agent.fleet.settings import FleetSettings
from edgeplex.agent.residency.state import Phase
from edgeplex.artifacts import ArtifactCache, FetchPolicy
from edgeplex.fleet import Backoff, mqtt_session, parse_mqtt_url, presence_topic
from edgeplex.net import grpc_silence_options, is_loopback
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.settings import state_dir
from edgeplex.signing import TrustStore

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.config import AgentSettings
    from edgeplex.agent.core import Agent

log = logging.getLogger("edgeplex.agent.fleet")
# Reports left unacknowledged this long end the link to a replica: two reports at
# the default interval (2 s), under half the default site lease (10 s).
CONTROL_PLANE_SILENCE_S = 4.0


def check_first_contact(fleet: FleetSettings) -> None:
    """ValueError for a join that cannot work or must not happen: a join token given
    but empty (the `admin site add` that should have filled it failed), or a first
    contact in clear text beyond this host (gRPC without tls_ca, or mqtt://, to a
    non-loopback address) unless fleet.allow_plaintext."""
    if not fleet.control_plane or not fleet.mqtt_url:
        return
    if fleet.join_token is not None and not fleet.join_token.get_secret_value().strip():
        raise ValueError(
            "fleet.join_token is set but empty: the `edgeplex admin site add` meant to "
            "issue it failed (was the control plane listening yet?); run it again and "
            "pass the token it prints"
        )
    if fleet.allow_plaintext:
        return
    mqtt = parse_mqtt_url(fleet.mqtt_url)
    clear = [
        t for t in fleet.control_plane_targets if fleet.tls_ca is None and not is_loopback(_host(t))
    ]
    if not mqtt.tls and not is_loopback(mqtt.host):
        clear.append(f"mqtt://{mqtt.host}:{mqtt.port}")
    if clear:
        raise ValueError(
            f"refusing to join the fleet in clear text over the network ({', '.join(clear)}): "
            "set fleet.tls_ca and use mqtts://, or fleet.allow_plaintext on a closed network"
        )


def _host(target: str) -> str:
    host, _, _ = target.rpartition(":")
    return (host or target).strip("[]")


class FleetLink:
    def __init__(self, settings: AgentSettings, agent: Agent, grpc_port: int, http_port: int):
        fleet = settings.fleet
        if not fleet.site_id or not fleet.region or not fleet.mqtt_url:
            raise ValueError("fleet mode needs --site-id, --region and --mqtt")
        self._settings = settings
        self._agent = agent
        self._site = fleet.site_id
        self._address = fleet.advertise_address or f"{settings.grpc_host}:{grpc_port}"
        self._http_address = fleet.advertise_http_address or f"{settings.http_host}:{http_port}"
        self._mqtt = parse_mqtt_url(fleet.mqtt_url)
        # Replicas of the control plane: the first that answers; the next on failure.
        self._targets = fleet.control_plane_targets
        check_first_contact(fleet)
        self._target_ix = 0
        artifact_dir = fleet.artifact_dir or settings.model_repo / ".artifacts"
        self.reconciler = Reconciler(
            agent,
            settings.model_repo,
            ArtifactCache(
                artifact_dir,
                fleet.max_artifact_bytes,
                FetchPolicy.of(fleet),
            ),
            disk_budget=settings.disk_cache_budget,
        )
        if self.reconciler.recover():  # installs a kill interrupted
            agent.discover()
        trust = TrustStore.load(
            fleet.control_plane_key, fleet.trust_file or state_dir() / "control-plane.pub"
        )
        self.messages = ControlMessages(
            self._site, fleet.region, trust, self._apply_desired, self._apply_routes
        )
        token = fleet.join_token.get_secret_value() if fleet.join_token else ""
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.on_demand = OnDemand(
            self._site, agent, self.reconciler, trust, self._channel, self._metadata
        )
        agent.on_demand = self.on_demand.fetch
        self.registered = asyncio.Event()
        self.reports_sent = 0
        self._interval = 2.0
        self._busy_ns = 0  # cumulative compute time at the last report

    async def run(self) -> None:
        loops = [self._control_loop(), self._mqtt_loop(), self.reconciler.run()]
        journal = self._agent.usage
        if journal is not None:
            every = max(1.0, journal.interval_s / 4)
            loops.append(usage_shipper.run(journal, self._site, self._send_usage, every))
        await asyncio.gather(*loops)

    async def _send_usage(self, report: pb.UsageReport) -> None:
        """One closed minute to the control plane, once registered (a refusal for an
        unknown site would only be retried): it waits for the registration."""
        await self.registered.wait()
        channel = self._channel()
        try:
            stub = pb_grpc.AgentServiceStub(channel)
            await stub.ReportUsage(report, timeout=10, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # the same, every time
                raise usage_shipper.Refused(exc.details() or "INVALID_ARGUMENT") from exc
            raise
        finally:
            await channel.close()

    # --- control plane --------------------------------------------------------------------

    @property
    def _target(self) -> str:
        """The control-plane replica this site talks to now."""
        return self._targets[self._target_ix % len(self._targets)]

    def _channel(self) -> grpc.aio.Channel:
        fleet = self._settings.fleet
        target = self._target
        options = grpc_silence_options(CONTROL_PLANE_SILENCE_S)
        if fleet.tls_ca is None:
            return grpc.aio.insecure_channel(target, options)
        creds = grpc.ssl_channel_credentials(
            root_certificates=fleet.tls_ca.read_bytes(),
            private_key=_read(fleet.tls_key),
            certificate_chain=_read(fleet.tls_cert),
        )
        return grpc.aio.secure_channel(target, creds, options)

    async def _control_loop(self) -> None:
        backoff = Backoff()
        while True:
            channel = self._channel()
            try:
                stub = pb_grpc.AgentServiceStub(channel)
                reply = await stub.Register(
                    self._registration(), timeout=10, metadata=self._metadata
                )
                self.messages.pin(reply.signing_key_id, reply.signing_public_key)
                self._interval = reply.report_interval_s or self._interval
                if reply.lease_s > 0:
                    # Back within a third of the lease after the control plane
                    # restarts, so a short outage does not mark this site down.
                    backoff.cap_s = max(0.5, reply.lease_s / 3)
                self.registered.set()
                backoff.reset()
                log.info("registered with the control plane as %s", self._site)
                await stub.Report(self._reports(), metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                self.registered.clear()
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("control plane forgot this site: registering again")
                    continue
                if exc.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ):
                    log.error("the control plane refused this site: %s", exc.details())
                delay = backoff.delay()
                log.warning(
                    "control plane %s unavailable (%s); retrying in %.1f s",
                    self._target,
                    exc.code().name,
                    delay,
                )
                self._target_ix += 1
                await asyncio.sleep(delay)
            finally:
                await channel.close()

    def _registration(self) -> pb.RegisterRequest:
        s = self._settings
        device = s.device_memory_budget or 0
        return pb.RegisterRequest(
            site_id=self._site,
            region=s.fleet.region,
            address=self._address,
            http_address=self._http_address,
            devices=[
                pb.Device(
                    kind=s.runner.execution_provider, index=s.runner.device_id, memory_bytes=device
                )
            ],
            budgets=pb.TierBudgets(
                device_bytes=device,
                host_bytes=s.host_memory_budget or 0,
                disk_bytes=s.disk_cache_budget or 0,
            ),
            execution_providers=[s.runner.execution_provider],
            agent_version=__version__,
        )

    async def _reports(self) -> AsyncIterator[pb.LoadReport]:
        self._agent.load_window.take()  # start a fresh interval
        while True:
            await asyncio.sleep(self._interval)
            yield self.report()
            self.reports_sent += 1

    def report(self) -> pb.LoadReport:
        """This interval's load: per model and per device."""
        elapsed, window = self._agent.load_window.take()
        agent = self._agent
        report = pb.LoadReport(
            site_id=self._site,
            sent_at=time.time(),
            desired_version=self.reconciler.applied_version,
        )
        busy_ns = 0
        for entry in agent.residency.records():
            w = window.get(entry.name)
            stats = agent.queues.stats(entry.key)
            queue = agent.queues.get(entry.key)
            busy_ns += stats.compute_infer.ns
            report.models.append(
                pb.ModelLoad(
                    name=entry.name,
                    version=entry.version,
                    rate_by_region={r: n / elapsed for r, n in w.by_region.items()} if w else {},
                    p50_ms=w.percentile(0.5) * 1000 if w else 0.0,
                    p99_ms=w.percentile(0.99) * 1000 if w else 0.0,
                    queue_depth=queue.depth if queue else 0,
                    tier=str(entry.tier),
                    memory_bytes=entry.device_bytes,
                    state=entry.public_state(),
                    reason=entry.reason if entry.phase == Phase.FAILED else "",
                    variant=entry.form,
                    bytes_by_variant={f: min(m) for f, m in entry.measured.items() if m},
                    variant_guard={f: guard_summary(v) for f, v in entry.variants.items()},
                )
            )
        here = {m.name for m in report.models}
        for name in sorted(window.keys() - here):  # asked for here, served elsewhere or not at all
            w = window[name]
            report.models.append(
                pb.ModelLoad(
                    name=name,
                    rate_by_region={r: n / elapsed for r, n in w.by_region.items()},
                    tier="remote",
                    state="FAILED" if name in self.reconciler.failures else "ABSENT",
                    reason=self.reconciler.failures.get(name, ""),
                )
            )
            here.add(name)
        for name, reason in sorted(self.reconciler.failures.items()):
            if name not in here:
                report.models.append(pb.ModelLoad(name=name, state="FAILED", reason=reason))
        previous, self._busy_ns = self._busy_ns, busy_ns
        report.devices.append(
            pb.DeviceLoad(
                index=self._settings.runner.device_id,
                used_bytes=agent.residency.device_bytes(),
                budget_bytes=self._settings.device_memory_budget or 0,
                utilization=min(1.0, max(0.0, (busy_ns - previous) / (elapsed * 1e9))),
            )
        )
        return report

    # --- desired state over MQTT ----------------------------------------------------------

    async def _mqtt_loop(self) -> None:
        backoff = Backoff()
        will = aiomqtt.Will(presence_topic(self._site), b"offline", qos=1, retain=True)
        while True:
            try:
                async with mqtt_session(
                    identifier=f"edgeplex-agent-{self._site}",
                    will=will,
                    **self._mqtt.client_kwargs(self._settings.fleet.tls_ca),  # type: ignore[arg-type]
                ) as client:
                    backoff.reset()
                    await client.publish(presence_topic(self._site), b"online", qos=1, retain=True)
                    for topic in self.messages.topics:
                        await client.subscribe(topic, qos=1)
                    log.info("subscribed to %s", ", ".join(self.messages.topics))
                    async for message in client.messages:
                        if isinstance(message.payload, bytes | bytearray):
                            self.messages.receive(message.topic.value, bytes(message.payload))
            except aiomqtt.MqttError as exc:
                delay = backoff.delay()
                log.warning("MQTT unavailable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)

    def _apply_routes(self, routes: pb.Routes) -> None:
        if self._agent.router is not None:
            self._agent.router.update(routes)

    def _apply_desired(self, desired: pb.DesiredState) -> None:
        if desired.site_id != self._site:
            log.warning("ignored desired state addressed to %s", desired.site_id)
            return
        if self._agent.router is not None and desired.peer_token:
            self._agent.router.peer_token = desired.peer_token
            self._agent.tenants.peer_token = desired.peer_token.encode()
        if desired.tenants_json:
            self._agent.tenants.replace_from(desired.tenants_json, "the control plane")
        if not self.reconciler.offer(desired):
            log.debug("ignored stale desired state v%d", desired.version)


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None
