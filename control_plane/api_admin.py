"""AdminService: the catalog, sites and placement, behind a bearer token.

Catalog entries start PENDING; a verification task fetches the artifact into
the control plane's content-addressed cache, checks its sha256 and opens it
with ONNX Runtime in a child process, then marks it READY (with its size) or
FAILED (with the reason, shown by `model show`). Only READY models are placed.
An entry left PENDING by a replica that died is verified again by the leader.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable

import grpc
from redis.exceptions import RedisError

from edgeplex.artifacts import (
    ArtifactCache,
    ArtifactError,
    artifact_bytes,
    check_sha256,
    check_uri,
    log_progress,
    model_file,
    probe_onnx,
)
from edgeplex.control_plane.api_batch import BatchAdmin
from edgeplex.control_plane.api_batch import redis_down as _redis_down
from edgeplex.control_plane.api_tenants import TenantAdmin
from edgeplex.control_plane.broker_files import CP_USER, BrokerFiles, reserved_site
from edgeplex.control_plane.explain import explain
from edgeplex.control_plane.placement import PlacementResult
from edgeplex.control_plane.planner import Planner
from edgeplex.control_plane.site_identity import new_token, token_hash
from edgeplex.control_plane.store import Store
from edgeplex.names import NAME_RULE, VARIANT_FORMS, VERSION_RULE, valid_name, valid_version
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc

log = logging.getLogger("edgeplex.control_plane.admin")

ADMIN_PREFIX = "/edgeplex.v1.AdminService/"


# What each role may call (the admin role may call everything): the batch submitter
# runs batch jobs against the catalog; the read-only role (dashboards, monitoring)
# reads state and changes nothing.
READ_METHODS = frozenset(
    {"ListModels", "GetModel", "ListSites", "GetPlacement", "ExplainPlacement", "ListBatches",
     "GetBatch", "ListTenants", "GetTenant", "GetUsage"}
)  # fmt: skip
BATCH_METHODS = READ_METHODS | {"SubmitBatch", "GetBatchResults", "CancelBatch"}


class TokenAuth(grpc.aio.ServerInterceptor):
    """Every AdminService call needs `authorization: Bearer <token>` of a role that may
    make it: the admin token, the batch token or the read token; others pass."""

    def __init__(self, token: str, batch_token: str | None = None, read_token: str | None = None):
        # (the header a role's token makes, the methods it may call; None: every one)
        self._roles: list[tuple[bytes, frozenset[str] | None]] = [
            (f"Bearer {token}".encode(), None)
        ]
        if batch_token:
            self._roles.append((f"Bearer {batch_token}".encode(), BATCH_METHODS))
        if read_token:
            self._roles.append((f"Bearer {read_token}".encode(), READ_METHODS))

        async def deny(request, context):  # type: ignore[no-untyped-def]
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "admin API: missing or wrong bearer token (set EDGEPLEX_ADMIN_TOKEN)",
            )

        async def forbid(request, context):  # type: ignore[no-untyped-def]
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "admin API: this token's role may not make this call (it needs the admin token)",
            )

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._forbid = grpc.unary_unary_rpc_method_handler(forbid)

    async def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        if details.method.startswith(ADMIN_PREFIX):
            given = dict(details.invocation_metadata or ()).get("authorization", "")
            given = given.encode() if isinstance(given, str) else given
            method = details.method[len(ADMIN_PREFIX) :]
            # Every role's token is compared, so the time taken says nothing of which.
            matches = [
                allowed for token, allowed in self._roles if hmac.compare_digest(given, token)
            ]
            if not matches:
                return self._deny
            if not any(roles is None or method in roles for roles in matches):
                return self._forbid
        return await continuation(details)


class AdminServicer(BatchAdmin, TenantAdmin, pb_grpc.AdminServiceServicer):
    def __init__(
        self,
        store: Store,
        planner: Planner,
        artifacts: ArtifactCache,
        poke: Callable[[], None],
        broker: BrokerFiles | None = None,
    ) -> None:
        self._store = store
        self._broker = broker
        self._planner = planner
        self._artifacts = artifacts
        self._poke = poke
        self._verifying: set[str] = set()
        # Artifacts already verified, by sha256: their size (content-addressed, so a
        # second model with the same artifact needs no second probe).
        self._verified: dict[str, int] = {}
        # Checks under way, by (sha256, URI): models added together that name the same
        # artifact wait for one fetch and probe, not one each.
        self._checking: dict[tuple[str, str], asyncio.Future[int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- catalog --------------------------------------------------------------------------

    async def AddModel(
        self, request: pb.CatalogModel, context: grpc.aio.ServicerContext
    ) -> pb.CatalogModel:
        problems = []
        if not valid_name(request.name):
            problems.append(f"name: {NAME_RULE}")
        if request.version and not valid_version(request.version):
            problems.append(f"version: {VERSION_RULE}, not {request.version[:32]!r}")
        try:
            check_uri(request.artifact_uri, self._artifacts.policy)
        except ArtifactError as exc:
            problems.append(f"artifact_uri: {exc}")
        try:
            sha = check_sha256(request.sha256)
        except ArtifactError as exc:
            problems.append(f"sha256: {exc}")
        if request.slo_ms < 0:
            problems.append("slo_ms: must be positive")
        unknown = sorted(set(request.variants) - set(VARIANT_FORMS))
        if unknown:
            problems.append(f"variants: unknown {unknown} (known: {', '.join(VARIANT_FORMS)})")
        if request.quality not in ("", "exact", "any"):
            problems.append("quality: exact or any")
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        model = pb.CatalogModel()
        model.CopyFrom(request)
        model.sha256 = sha
        model.version = model.version or "1"
        model.state, model.reason, model.size_bytes = "PENDING", "", 0
        model.added_at = time.time()
        try:
            existing = await self._store.get_model(model.name)
            if existing is not None and (existing.sha256, existing.artifact_uri) == (
                sha,
                model.artifact_uri,
            ):
                # Same artifact: keep its verification, update the serving options.
                model.state, model.reason = existing.state, existing.reason
                model.size_bytes, model.device_bytes = existing.size_bytes, existing.device_bytes
                model.added_at = existing.added_at
            elif model.sha256 in self._verified:  # an artifact checked for another model
                _ready(model, self._verified[model.sha256])
                log.info("model %s: READY (its artifact was checked before)", model.name)
            await self._store.put_model(model)
            await self._store.notify("catalog")
        except RedisError:
            await _redis_down(context)
        if model.state == "PENDING":
            self.verify(model.name)
        self._poke()
        return model

    def verify(self, name: str) -> None:
        if name in self._verifying:
            return
        self._verifying.add(name)
        task = asyncio.create_task(self._verify(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def verify_pending(self) -> None:
        """Verify entries left PENDING (by a replica that died mid-verification)."""
        for model in await self._store.models():
            if model.state == "PENDING":
                self.verify(model.name)

    async def _verify(self, name: str) -> None:
        try:
            model = await self._store.get_model(name)
            if model is None:
                return
            try:
                size = self._verified.get(model.sha256, -1)
                if size < 0:
                    size = await self._checked(model)
                state, reason = "READY", ""
            except ArtifactError as exc:
                state, reason, size = "FAILED", str(exc), 0
            current = await self._store.get_model(name)
            if current is None or current.sha256 != model.sha256:
                return  # removed or replaced meanwhile
            if state == "READY":
                _ready(current, size)
            else:
                current.state, current.reason, current.size_bytes = state, reason, size
            await self._store.put_model(current)
            await self._store.notify("catalog")
            log.info("model %s: %s%s", name, state, f" ({reason})" if reason else "")
            self._poke()
        except RedisError as exc:
            log.warning("verification of %s interrupted: %s", name, exc)
        finally:
            self._verifying.discard(name)

    async def _checked(self, model: pb.CatalogModel) -> int:
        """The size of `model`'s artifact, fetched and opened by ONNX Runtime: once for
        all the models that name it while the check runs. Raises ArtifactError."""
        key = (model.sha256, model.artifact_uri)
        check = self._checking.get(key)
        if check is None:
            check = self._checking[key] = asyncio.ensure_future(self._check(model))

            def done(ended: asyncio.Future[int]) -> None:
                del self._checking[key]
                if not ended.cancelled():
                    ended.exception()  # retrieved here too, should no model wait any more

            check.add_done_callback(done)
        return await asyncio.shield(check)  # one waiter cancelled stops no other's

    async def _check(self, model: pb.CatalogModel) -> int:
        path = await asyncio.to_thread(
            self._artifacts.fetch,
            model.artifact_uri,
            model.sha256,
            progress=log_progress(log, f"model {model.name}"),
        )
        await asyncio.to_thread(probe_onnx, model_file(path))
        size = self._verified[model.sha256] = artifact_bytes(path)
        log.info("artifact %s fetched and opened: %d bytes", model.sha256[:12], size)
        return size

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        try:
            return pb.ListModelsResponse(models=await self._store.models())
        except RedisError:
            await _redis_down(context)
            raise

    async def GetModel(
        self, request: pb.ModelName, context: grpc.aio.ServicerContext
    ) -> pb.ModelDetail:
        try:
            model = await self._store.get_model(request.name)
            reports = await self._store.reports()
        except RedisError:
            await _redis_down(context)
            raise
        if model is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"model '{request.name}' is not in the catalog"
            )
        detail = pb.ModelDetail(model=model)
        for site_id in sorted(reports):
            for m in reports[site_id].models:
                if m.name == request.name:
                    detail.sites.append(
                        pb.SiteModelState(
                            site_id=site_id,
                            tier=m.tier,
                            state=m.state,
                            reason=m.reason,
                            rate=sum(m.rate_by_region.values()),
                            variant=m.variant,
                            variant_guard=dict(m.variant_guard),
                        )
                    )
        return detail

    async def RemoveModel(
        self, request: pb.ModelName, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        try:
            removed = await self._store.remove_model(request.name)
            await self._store.notify("catalog")
        except RedisError:
            await _redis_down(context)
        if not removed:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"model '{request.name}' is not in the catalog"
            )
        self._poke()
        return pb.Empty()

    # --- sites ----------------------------------------------------------------------------

    async def AddSite(
        self, request: pb.AddSiteRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddSiteResponse:
        for what, value in (("site_id", request.site_id), ("region", request.region)):
            if not valid_name(value):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {NAME_RULE}")
        if reserved_site(request.site_id, self._broker.cp_user if self._broker else CP_USER):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"site_id {request.site_id!r} is reserved: names starting with 'edgeplex-' "
                "belong to the fleet's own services (the control plane's broker user)",
            )
        token = new_token()
        try:
            await self._store.put_join_token(request.site_id, request.region, token_hash(token))
            regions = await self._store.site_regions()
        except RedisError:
            await _redis_down(context)
            raise
        password = ""
        if self._broker is not None:
            password = await asyncio.to_thread(self._broker.add_site, request.site_id, regions)
        log.info(
            "site %s (%s) may join; a new join token was issued", request.site_id, request.region
        )
        return pb.AddSiteResponse(site_id=request.site_id, join_token=token, mqtt_password=password)

    async def ListSites(
        self, request: pb.ListSitesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSitesResponse:
        try:
            sites = await self._store.sites()
            seen = await self._store.seen()
            reports = await self._store.reports()
        except RedisError:
            await _redis_down(context)
            raise
        for site in sites:
            site.last_report_at = seen.get(site.site_id, 0.0)
            report = reports.get(site.site_id)
            if report is not None:
                site.loaded[:] = sorted(m.name for m in report.models if m.tier == "loaded")
                site.device_used_bytes = sum(d.used_bytes for d in report.devices)
        return pb.ListSitesResponse(sites=sites)

    async def CordonSite(
        self, request: pb.SiteAction, context: grpc.aio.ServicerContext
    ) -> pb.Site:
        return await self._flag(request, context, "cordoned")

    async def DrainSite(self, request: pb.SiteAction, context: grpc.aio.ServicerContext) -> pb.Site:
        return await self._flag(request, context, "draining")

    async def _flag(
        self, request: pb.SiteAction, context: grpc.aio.ServicerContext, flag: str
    ) -> pb.Site:
        try:
            site = await set_site_flag(self._store, request.site_id, flag, not request.undo)
            if site is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"site '{request.site_id}' is not registered"
                )
            assert site is not None
        except RedisError:
            await _redis_down(context)
            raise
        self._poke()
        return site

    # --- placement ------------------------------------------------------------------------

    async def GetPlacement(
        self, request: pb.PlacementRequest, context: grpc.aio.ServicerContext
    ) -> pb.Placement:
        try:
            placement = await self._store.placement()
        except RedisError:
            await _redis_down(context)
            raise
        return placement or pb.Placement()

    async def ExplainPlacement(
        self, request: pb.ModelName, context: grpc.aio.ServicerContext
    ) -> pb.PlacementExplanation:
        try:
            inp, *_ = await self._planner.build_input(update_demand=False)
            placement = await self._store.placement() or pb.Placement()
        except RedisError:
            await _redis_down(context)
            raise
        result = PlacementResult(
            loaded={s.site_id: list(s.loaded) for s in placement.sites},
            staged={s.site_id: list(s.staged) for s in placement.sites},
            objective=placement.objective,
            served_fraction=placement.served_fraction,
        )
        lines = explain(inp, result, request.name, self._planner.observed, self._planner.forecast)
        return pb.PlacementExplanation(model=request.name, lines=lines)


async def set_site_flag(store: Store, site_id: str, flag: str, on: bool) -> pb.Site | None:
    """Cordon or drain a site (flag "cordoned" or "draining"), or undo it; None when
    the site is not registered. The caller pokes the planner."""
    site = await store.get_site(site_id)
    if site is None:
        return None
    setattr(site, flag, on)
    await store.put_site(site)
    await store.notify("sites")
    return site


def _ready(model: pb.CatalogModel, size: int) -> None:
    """`model` verified: its artifact is `size` bytes. A session needs about its
    weights plus ORT's working memory until an agent reports the measured figure."""
    model.state, model.reason, model.size_bytes = "READY", "", size
    model.device_bytes = int(size * 1.1)
