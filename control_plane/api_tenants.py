"""The tenant verbs of AdminService: add, update, list, show, remove, keys issued
and revoked, and the usage the sites recorded. The table lives in Redis
(store.py); every change tells the planner, which sends it at once to every site
inside a new signed desired state, on the placement it has (no round waited for)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from redis.exceptions import RedisError

from edgeplex import tenants
from edgeplex.control_plane import usage
from edgeplex.control_plane.api_batch import redis_down
from edgeplex.control_plane.planner import Planner
from edgeplex.control_plane.store import Store
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.tenants import Tenant, TenantTable


def tenant_info(tenant: Tenant) -> pb.TenantInfo:
    info = pb.TenantInfo(name=tenant.name, weight=tenant.weight, models=tenant.models)
    for field in ("rate", "fleet_rate", "burst", "concurrency"):
        value = getattr(tenant, field)
        if value is not None:
            setattr(info, field, value)
    info.keys.extend(pb.TenantKeyInfo(id=k.id, created=k.created) for k in tenant.keys)
    return info


def limits_of(spec: pb.TenantSpec, adding: bool) -> dict[str, Any]:
    """The limits a spec gives (those it leaves unset are not in it)."""
    limits: dict[str, Any] = {
        field: getattr(spec, field)
        for field in ("rate", "fleet_rate", "burst", "concurrency", "weight")
        if spec.HasField(field)
    }
    if adding or spec.models_given:
        limits["models"] = list(spec.models)
    return limits


class TenantAdmin:
    """The tenant verbs of AdminService (mixed into AdminServicer)."""

    _store: Store
    _planner: Planner

    async def AddTenant(
        self, request: pb.TenantSpec, context: grpc.aio.ServicerContext
    ) -> pb.TenantInfo:
        limits = limits_of(request, adding=True)
        return await self._change(
            context, lambda t: tenants.add(t, request.name, limits), request.name
        )

    async def UpdateTenant(
        self, request: pb.TenantSpec, context: grpc.aio.ServicerContext
    ) -> pb.TenantInfo:
        limits = limits_of(request, adding=False)
        return await self._change(
            context, lambda t: tenants.update(t, request.name, limits), request.name
        )

    async def ListTenants(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.ListTenantsResponse:
        table = await self._read(context)
        return pb.ListTenantsResponse(tenants=[tenant_info(t) for t in table.tenants.values()])

    async def GetTenant(
        self, request: pb.TenantName, context: grpc.aio.ServicerContext
    ) -> pb.TenantInfo:
        table = await self._read(context)
        tenant = table.tenants.get(request.name)
        if tenant is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no tenant '{request.name}'")
        return tenant_info(tenant)  # type: ignore[arg-type]  # abort raised otherwise

    async def RemoveTenant(
        self, request: pb.TenantName, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        await self._change(context, lambda t: tenants.remove(t, request.name), "")
        return pb.Empty()

    async def IssueTenantKey(
        self, request: pb.TenantName, context: grpc.aio.ServicerContext
    ) -> pb.IssuedKey:
        issued: list[tuple[str, str]] = []

        def issue(table: TenantTable) -> TenantTable:
            changed, key, record = tenants.issue_key(table, request.name)
            issued[:] = [(key, record.id)]
            return changed

        await self._change(context, issue, request.name)
        key, key_id = issued[0]
        return pb.IssuedKey(tenant=request.name, key_id=key_id, key=key)

    async def RevokeTenantKey(
        self, request: pb.KeyRef, context: grpc.aio.ServicerContext
    ) -> pb.TenantInfo:
        return await self._change(
            context, lambda t: tenants.revoke_key(t, request.tenant, request.key_id), request.tenant
        )

    async def GetUsage(
        self, request: pb.UsageQuery, context: grpc.aio.ServicerContext
    ) -> pb.UsageTable:
        if request.by and request.by not in usage.GROUPS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"by: one of {', '.join(usage.GROUPS)}"
            )
        by = request.by or "model"
        summary = usage.Summary(request.tenant, request.from_time, request.to_time, by)
        parts = self._store.usage.parts_by(request.from_time, request.to_time, by)
        try:
            async for part in parts:
                summary.add(part)
        except usage.UsageGone as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RedisError:
            await redis_down(context)
            raise
        return summary.table()

    # --- the plumbing ---------------------------------------------------------------------

    async def _read(self, context: grpc.aio.ServicerContext) -> TenantTable:
        try:
            return await self._store.tenants()
        except RedisError:
            await redis_down(context)
            raise

    async def _change(
        self,
        context: grpc.aio.ServicerContext,
        change: Callable[[TenantTable], TenantTable],
        shown: str,
    ) -> pb.TenantInfo:
        """Apply `change` to the stored table; the tenant `shown` as it then is."""
        try:
            table = await self._store.change_tenants(change)
        except tenants.UnknownTenant as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise
        except tenants.TenantExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
            raise
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        except RedisError:
            await redis_down(context)
            raise
        self._planner.tenants_changed()
        tenant = table.tenants.get(shown)
        return tenant_info(tenant) if tenant is not None else pb.TenantInfo()
