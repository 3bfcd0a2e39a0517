"""The fleet dashboard, served at `/` by the control plane's HTTP listener.

One page (dashboard.html: server-rendered HTML, a little JavaScript, no build
step) polls `/dashboard/state.json`, which shows:

- each site's health: up, cordoned, draining, the age of its last report, its
  busiest device's utilisation;
- a sites x models matrix of tiers (loaded, staged, cached) from the reports;
- demand per region over time (sampled here every `SAMPLE_S` from the demand
  the placement loop keeps in Redis, the last `HISTORY` samples);
- the catalog, each model's placement explanation on request
  (`/dashboard/explain/{model}`);
- batch jobs with their progress;
- each tenant's usage over the last day, 7 or 30 days, by model, site, hour
  or day (`/dashboard/usage.json?by=&days=&tenant=`: the hourly sums, the fleet's hours
  and the sites' days, docs/tenants.md; read at most every `USAGE_CACHE_S`,
  however many pages poll).

Viewing needs no token. The actions (cordon, drain, cancel a batch job) are
POSTs that need the admin token as `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from redis.exceptions import RedisError

from edgeplex.control_plane import usage
from edgeplex.control_plane.api_admin import set_site_flag
from edgeplex.control_plane.api_batch import cancel_batch
from edgeplex.control_plane.explain import explain
from edgeplex.control_plane.placement import PlacementResult
from edgeplex.control_plane.usage import Summary
from edgeplex.names import NAME_RULE, valid_name
from edgeplex.net import bearer_token
from edgeplex.proto import edgeplex_control_pb2 as pb

if TYPE_CHECKING:
    from edgeplex.control_plane.planner import Planner
    from edgeplex.control_plane.store import Store

PAGE = Path(__file__).with_name("dashboard.html")
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'; "
    "script-src 'unsafe-inline'"
)
SAMPLE_S = 5.0
HISTORY = 720  # an hour at 5 s
USAGE_HOURS = 24  # the usage table's last day: this hour so far and the 23 before
USAGE_DAYS = (1, 7, 30)  # the windows the usage table offers, in days
USAGE_BY = ("model", "site", "hour", "day")
USAGE_CACHE_S = 10.0  # a usage view is read from Redis at most this often


class Dashboard:
    def __init__(
        self, store: Store, planner: Planner, admin_token: str, poke: Callable[[], None]
    ) -> None:
        self._store, self._planner, self._token, self._poke = store, planner, admin_token, poke
        self.history: deque[tuple[float, dict[str, float]]] = deque(maxlen=HISTORY)
        # (by, days): (when read, rows)
        self._usage: dict[tuple[str, int], tuple[float, list[dict[str, object]]]] = {}
        self._usage_read = asyncio.Lock()  # one read of Redis at a time, for every page
        # Each hour's rows by (by, hour), with the hour's count of minutes stored when
        # read (UsageStore.versions): read again only once a minute has come since.
        self._hours: dict[tuple[str, int], tuple[int, list[pb.UsageRow]]] = {}
        # A longer window's hours before the last day, by (by, days): their first hour
        # and counts of minutes when read, and their rows.
        self._before: dict[tuple[str, int], tuple[int, list[int], list[pb.UsageRow]]] = {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/", self.page),
            web.get("/dashboard/state.json", self.state),
            web.get("/dashboard/usage.json", self.usage),
            web.get("/dashboard/explain/{model}", self.explain),
            web.post("/dashboard/sites/{site}/{action}", self._admin(self.site_action)),
            web.post("/dashboard/batches/{job}/cancel", self._admin(self.cancel)),
        ]

    async def sample(self) -> None:
        """Regional demand over time, for the chart (runs until cancelled)."""
        while True:
            with contextlib.suppress(RedisError):
                demand, _ = await self._store.demand()
                totals: dict[str, float] = {}
                for (region, _model), rate in demand.items():
                    totals[region] = totals.get(region, 0.0) + rate
                self.history.append((time.time(), totals))
            await asyncio.sleep(SAMPLE_S)

    # --- views ------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(
            text=PAGE.read_text(),
            content_type="text/html",
            headers={"Content-Security-Policy": CSP},
        )

    async def state(self, request: web.Request) -> web.Response:
        try:
            sites = await self._store.sites()
            reports = await self._store.reports()
            seen = await self._store.seen()
            catalog = await self._store.models()
            jobs = await self._store.batch_jobs()
            done = {j.job_id: len(await self._store.batch_done_shards(j.job_id)) for j in jobs}
        except RedisError:
            return web.json_response({"error": "Redis is unavailable"}, status=503)
        now = time.time()
        tiers: dict[str, dict[str, str]] = {}
        site_rows = []
        for s in sorted(sites, key=lambda s: (s.region, s.site_id)):
            report = reports.get(s.site_id)
            tiers[s.site_id] = {m.name: m.tier for m in report.models} if report else {}
            heard = seen.get(s.site_id)
            site_rows.append(
                {
                    "site": s.site_id,
                    "region": s.region,
                    "up": s.up,
                    "cordoned": s.cordoned,
                    "draining": s.draining,
                    "address": s.address,
                    "last_report_s": round(now - heard, 1) if heard else None,
                    "utilization": max((d.utilization for d in report.devices), default=0.0)
                    if report
                    else None,
                    "failed": sorted(m.name for m in report.models if m.state == "FAILED")
                    if report
                    else [],
                }
            )
        return web.json_response(
            {
                "sites": site_rows,
                "models": [
                    {"name": m.name, "state": m.state, "bytes": m.size_bytes, "reason": m.reason}
                    for m in sorted(catalog, key=lambda m: m.name)
                ],
                "tiers": tiers,
                "demand": [{"t": t, "regions": r} for t, r in self.history],
                "batches": [
                    {
                        "job": j.job_id,
                        "model": j.model,
                        "state": j.state,
                        "items": j.items,
                        "shards": j.shards,
                        "shards_done": j.shards if j.state == "DONE" else done[j.job_id],
                        "failed": j.items_failed,
                    }
                    for j in sorted(jobs, key=lambda j: -j.created_at)
                ],
            }
        )

    async def usage(self, request: web.Request) -> web.Response:
        """Each tenant's usage (or one `tenant`'s) in the last `days` days (1 by
        default, 7 or 30; whole hours: this one so far and those before it), by model
        (default), site, hour or day."""
        by = request.query.get("by", "model")
        if by not in USAGE_BY:
            return web.json_response({"error": "by: model, site, hour or day"}, status=400)
        days_text = request.query.get("days", "1")
        days = int(days_text) if days_text.isdigit() else 0
        if days not in USAGE_DAYS:
            return web.json_response({"error": "days: 1, 7 or 30"}, status=400)
        tenant = request.query.get("tenant", "")
        if tenant and not valid_name(tenant):
            return web.json_response({"error": f"tenant: {NAME_RULE}"}, status=400)
        async with self._usage_read:
            now = time.time()
            read_at, rows = self._usage.get((by, days), (0.0, []))
            if now - read_at >= USAGE_CACHE_S:
                since = usage.last_hours(now, USAGE_HOURS)
                try:
                    summary = await self._usage_since(since, by)
                    if days > 1:
                        summary.merge(await self._usage_before(since, days, by))
                except RedisError:
                    return web.json_response({"error": "Redis is unavailable"}, status=503)
                rows = [_usage_row(u, by) for u in summary.table().rows]
                self._usage[(by, days)] = (now, rows)
        if tenant:
            rows = [row for row in rows if row["tenant"] == tenant]
        return web.json_response({"by": by, "days": days, "hours": 24 * days, "rows": rows})

    async def _usage_since(self, since: int, by: str) -> Summary:
        """The window's rows from each hour's own: an hour no minute has reached since
        it was last read is taken from the cache (in a large fleet, all but this hour
        and those a late minute reached), the rest read from their sums."""
        hours = [since + i * usage.HOUR_S for i in range(USAGE_HOURS)]
        # Counts first: a minute stored while its hour is read moves the count after.
        versions = await self._store.usage.versions(hours)
        summary = Summary("", since, 0, by)
        for hour, version in zip(hours, versions, strict=True):
            cached = self._hours.get((by, hour))
            if cached is None or cached[0] != version:
                one = Summary("", hour, hour + usage.HOUR_S, by)
                async for part in self._store.usage.parts_by(hour, hour + usage.HOUR_S, by):
                    one.add(part)
                cached = self._hours[(by, hour)] = (version, list(one.table().rows))
            summary.merge(cached[1])
        for key in [k for k in self._hours if k[1] < since]:
            del self._hours[key]  # out of the window
        return summary

    async def _usage_before(self, end: int, days: int, by: str) -> list[pb.UsageRow]:
        """The rows of a `days` window's hours before `end` (the last day's first
        hour), in one query of the longer sums: the fleet's hours (rows not by site)
        or the sites' days (by site). Read again only when its first hour moved (each
        hour) or a late minute reached one of its hours."""
        start = end - (days * 24 - USAGE_HOURS) * usage.HOUR_S
        hours = list(range(start, end, usage.HOUR_S))
        versions = await self._store.usage.versions(hours)
        cached = self._before.get((by, days))
        if cached is not None and cached[0] == start and cached[1] == versions:
            return cached[2]
        summary = Summary("", start, end, by)
        async for part in self._store.usage.parts_by(start, end, by):
            summary.add(part)
        rows = list(summary.table().rows)
        self._before[(by, days)] = (start, versions, rows)
        return rows

    async def explain(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if not valid_name(model):
            return web.json_response({"error": "not a model name"}, status=400)
        try:
            inp, *_ = await self._planner.build_input(update_demand=False)
            placement = await self._store.placement()
        except RedisError:
            return web.json_response({"error": "Redis is unavailable"}, status=503)
        result = PlacementResult(
            loaded={s.site_id: list(s.loaded) for s in placement.sites} if placement else {},
            staged={s.site_id: list(s.staged) for s in placement.sites} if placement else {},
            objective=placement.objective if placement else 0.0,
            served_fraction=placement.served_fraction if placement else 0.0,
        )
        planner = self._planner
        lines = explain(inp, result, model, planner.observed, planner.forecast)
        return web.json_response({"model": model, "lines": lines})

    # --- actions ----------------------------------------------------------------------------

    def _admin(
        self, handler: Callable[[web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def guarded(request: web.Request) -> web.Response:
            token = bearer_token(request.headers.get("Authorization"))
            if not token or not hmac.compare_digest(token.encode(), self._token.encode()):
                return web.json_response(
                    {"error": "the admin token is required (Authorization: Bearer ...)"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            try:
                return await handler(request)
            except RedisError:
                return web.json_response({"error": "Redis is unavailable"}, status=503)

        return guarded

    async def site_action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]  # cordon, uncordon, drain, undrain
        flags = {"cordon": ("cordoned", True), "uncordon": ("cordoned", False),
                 "drain": ("draining", True), "undrain": ("draining", False)}  # fmt: skip
        if action not in flags:
            return web.json_response({"error": f"unknown action '{action}'"}, status=404)
        flag, on = flags[action]
        site = await set_site_flag(self._store, request.match_info["site"], flag, on)
        if site is None:
            return web.json_response({"error": "no such site"}, status=404)
        self._poke()
        return web.json_response({"site": site.site_id, flag: on})

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            job = await cancel_batch(self._store, request.match_info["job"])
        except LookupError as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=409)
        return web.json_response({"job": job.job_id, "state": job.state})


def _usage_row(row: pb.UsageRow, by: str) -> dict[str, object]:
    return {
        "tenant": row.tenant,
        by: row.key,
        "requests": row.requests,
        "failures": row.failures,
        "bytes_in": row.bytes_in,
        "bytes_out": row.bytes_out,
        "compute_s": round(row.compute_s, 3),
        "cold_starts": row.cold_starts,
        "device_gb_h": round(row.device_byte_seconds / 3.6e12, 6),
    }
