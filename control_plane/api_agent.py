"""AgentService: agents register and stream load reports.

Reports are written behind: the servicer only validates and buffers them,
and one task (`ReportSink.run`) writes the newest report of each site to Redis
in one pipelined round trip every `flush_interval_s`. Losing the last 50 ms of
reports on a crash costs nothing (the next report replaces them); writing each
one synchronously would cap ingestion at Redis round trips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from redis.exceptions import RedisError

from edgeplex.control_plane import usage
from edgeplex.control_plane.api_batch import redis_down
from edgeplex.control_plane.config import ControlPlaneSettings
from edgeplex.control_plane.demand import report_problem
from edgeplex.control_plane.metrics import METRICS
from edgeplex.control_plane.planner import desired_model
from edgeplex.control_plane.site_identity import Refused, authenticate, check_address
from edgeplex.control_plane.store import Store
from edgeplex.fleet import desired_topic
from edgeplex.names import valid_name
from edgeplex.net import is_loopback
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.signing import CATALOG_ENTRY, site_audience

log = logging.getLogger("edgeplex.control_plane.agents")

CREDENTIALS_POLL_S = 1.0
RECHECK_S = 10.0  # a report stream's site is checked again at least this often
REDIS_RETRY_S = 2.0  # ...and this long after Redis could not answer the check
CATALOG_ENTRY_TTL_S = 60.0


class ReportSink:
    def __init__(self, store: Store, flush_interval_s: float = 0.05) -> None:
        self._store = store
        self._interval = flush_interval_s
        self._buffer: dict[str, pb.LoadReport] = {}
        self.written = 0

    def add(self, report: pb.LoadReport) -> None:
        self._buffer[report.site_id] = report

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()

    async def flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, {}
        started = time.perf_counter()
        try:
            await self._store.write_reports(batch.values())
        except RedisError as exc:
            log.warning("reports not written, will retry: %s", exc)
            for site, report in batch.items():
                self._buffer.setdefault(site, report)
            await asyncio.sleep(0.5)
            return
        self.written += len(batch)
        METRICS.report_flush_seconds.observe(time.perf_counter() - started)


def stamped(report: pb.LoadReport) -> pb.LoadReport:
    """The report with its arrival time: the lease runs on the control plane's clock,
    not the agent's."""
    report.sent_at = time.time()
    return report


class CredentialWatch:
    """The join tokens' epoch (Store.credentials_epoch), read once a second for all
    report streams. A stream checks its site's token and registration again when
    the epoch moves (a token rotated or revoked ends its streams within about a
    second) and every RECHECK_S regardless (Redis lost its data), instead of two
    Redis reads per report: at a thousand sites, a fifth of the control plane's
    time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.epoch: bytes | None = None

    async def run(self) -> None:
        while True:
            with contextlib.suppress(RedisError):
                self.epoch = await self._store.credentials_epoch()
            await asyncio.sleep(CREDENTIALS_POLL_S)


class AgentServicer(pb_grpc.AgentServiceServicer):
    """Register and Report, each only for the site the caller proves to be
    (site_identity.py)."""

    def __init__(
        self,
        settings: ControlPlaneSettings,
        store: Store,
        sink: ReportSink,
        credentials: CredentialWatch,
        on_change,
        signer,
    ) -> None:  # type: ignore[no-untyped-def]
        self._settings = settings
        self._store = store
        self._sink = sink
        self._credentials = credentials
        self._on_change = on_change
        self._signer = signer

    async def _identify(
        self,
        context: grpc.aio.ServicerContext,
        site_id: str,
        region: str | None,
        redis_down_ok: bool = False,
    ) -> bool:
        """Abort the call unless the caller proves it is `site_id`. With Redis
        unavailable: abort, or with `redis_down_ok` return False (not checked)."""
        if self._settings.open_registration:
            return True
        try:
            await authenticate(context, self._store, site_id, region)
        except Refused as refused:
            METRICS.refused_agents.labels(code=refused.code.name).inc()
            log.warning("refused an agent call for site %s: %s", site_id, refused.message)
            await context.abort(refused.code, refused.message)
        except RedisError:
            if not redis_down_ok:
                await redis_down(context)
            return False
        return True

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        if not valid_name(request.site_id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "site_id: letters, digits, '_.-', at most 128"
            )
        if not valid_name(request.region):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "region: letters, digits, '_.-', at most 128"
            )
        try:
            local = is_loopback(self._settings.grpc_host)
            check_address("address", request.address, required=True, allow_loopback=local)
            check_address("http_address", request.http_address, False, allow_loopback=local)
        except Refused as refused:
            await context.abort(refused.code, refused.message)
        await self._identify(context, request.site_id, request.region)
        try:
            existing = await self._store.get_site(request.site_id)
            now = time.time()
            site = pb.Site(
                site_id=request.site_id,
                region=request.region,
                address=request.address,
                http_address=request.http_address,
                budgets=request.budgets,
                execution_providers=list(request.execution_providers),
                up=True,
                cordoned=existing.cordoned if existing else False,
                draining=existing.draining if existing else False,
                registered_at=now,
                last_report_at=now,
            )
            await self._store.put_site(site)
            await self._store.touch(site.site_id, now)
            await self._store.notify("sites")
        except RedisError:
            await redis_down(context)
        log.info("site %s (%s) registered at %s", request.site_id, request.region, request.address)
        self._on_change()
        return pb.RegisterResponse(
            lease_s=self._settings.site_lease_s,
            report_interval_s=self._settings.report_interval_s,
            desired_topic=desired_topic(request.site_id),
            signing_key_id=self._signer.key_id,
            signing_public_key=self._signer.public,
        )

    async def _registered(
        self, context: grpc.aio.ServicerContext, site_id: str, redis_down_ok: bool
    ) -> bool:
        """Abort the stream unless its caller is `site_id` and the site is registered;
        False (not checked) when Redis is unavailable and `redis_down_ok`."""
        if not await self._identify(context, site_id, None, redis_down_ok):
            return False
        try:
            site = await self._store.get_site(site_id)
        except RedisError:
            if redis_down_ok:
                return False
            await redis_down(context)
        if site is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"site '{site_id}' is not registered; register again",
            )
        return True

    async def Report(self, request_iterator, context: grpc.aio.ServicerContext) -> pb.ReportSummary:  # type: ignore[no-untyped-def]
        with METRICS.report_streams.track_inprogress():  # until the stream ends, however
            count = 0
            known: str | None = None
            checked_epoch, recheck_at = None, 0.0
            async for report in request_iterator:
                problem = report_problem(report)
                if problem:
                    METRICS.bad_reports.inc()
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                # The credential and the registration are checked on the first report, when
                # any join token changed, and every RECHECK_S: a rotated or revoked join
                # token ends the stream, and a control plane that lost the registration
                # (Redis wiped) says so. A stream whose site was checked goes on while
                # Redis is away (a failover): checked again on its next report, rather
                # than a thousand agents registering again at once.
                now, epoch = time.monotonic(), self._credentials.epoch
                again = report.site_id == known
                if not again or epoch != checked_epoch or now >= recheck_at:
                    checked = await self._registered(context, report.site_id, redis_down_ok=again)
                    checked_epoch = epoch
                    recheck_at = now + (RECHECK_S if checked else REDIS_RETRY_S)
                    known = report.site_id
                self._sink.add(stamped(report))
                METRICS.reports.inc()
                count += 1
            return pb.ReportSummary(reports=count)

    async def ReportUsage(
        self, request: pb.UsageReport, context: grpc.aio.ServicerContext
    ) -> pb.UsageAck:
        await self._identify(context, request.site_id, None)
        problem = usage.check(request)
        if problem:
            METRICS.usage_minutes.labels(outcome="refused").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            stored = await self._store.usage.put(request)
        except RedisError:
            await redis_down(context)
            raise
        METRICS.usage_minutes.labels(outcome="stored" if stored else "again").inc()
        return pb.UsageAck()

    async def LookupModel(
        self, request: pb.ModelLookup, context: grpc.aio.ServicerContext
    ) -> pb.SignedMessage:
        if not valid_name(request.model):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model: not a valid model name")
        if not 8 <= len(request.nonce) <= 64:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "nonce: 8 to 64 bytes")
        await self._identify(context, request.site_id, None)
        reason = ""
        try:
            site = await self._store.get_site(request.site_id)
            model = await self._store.get_model(request.model)
            if site is None:
                reason = f"cannot be loaded at {request.site_id}: the site is not registered"
            elif model is not None and model.state not in ("READY", "PENDING"):
                # PENDING: still being verified here; the site checks the sha256 itself
                reason = f"is {model.state} in the catalog: {model.reason}"
            elif model is not None and model.regions and site.region not in model.regions:
                reason = f"is not allowed in region {site.region}"
            found = site is not None and model is not None and not reason
            if found:
                assert site is not None
                region = request.origin_region if valid_name(request.origin_region) else ""
                await self._store.put_demand_hint(
                    site.site_id, region or site.region, request.model, time.time()
                )
                await self._store.notify("demand")
        except RedisError:
            await redis_down(context)
        entry = pb.CatalogEntry(nonce=request.nonce, found=found, reason=reason)
        if found:
            assert site is not None and model is not None
            entry.model.CopyFrom(desired_model(model, "loaded"))
            log.info("site %s asked for %s: loading it there on demand", site.site_id, model.name)
            self._on_change()  # placement sees the demand now, not at its next period
        return pb.SignedMessage.FromString(
            self._signer.seal(
                CATALOG_ENTRY,
                site_audience(request.site_id),
                0,
                entry.SerializeToString(),
                CATALOG_ENTRY_TTL_S,
            )
        )
