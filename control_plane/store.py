"""All control-plane state, in Redis. The only module that knows the key layout.

    edgeplex:models          hash  name -> CatalogModel (protobuf)
    edgeplex:sites           hash  site -> Site (protobuf: registration, cordon, drain)
    edgeplex:seen            zset  site -> unix time of its last report (the site lease)
    edgeplex:reports         hash  site -> latest LoadReport (protobuf)
    edgeplex:demand          hash  "region|model" -> EWMA requests/s
    edgeplex:demand_at       string  unix time of the last EWMA update
    edgeplex:placement       string  the current Placement (protobuf)
    edgeplex:version         string  counter of placement versions
    edgeplex:desired         hash  site -> the DesiredState last published
    edgeplex:leader          string  replica id, with a TTL (the leader lease)
    edgeplex:events          pub/sub  "catalog", "sites": wake the placement loop

Values are protobuf bytes from proto/edgeplex_control.proto, never pickle.
Every method is a coroutine that may raise redis.exceptions.ConnectionError
while Redis is down; callers decide whether to retry or to answer UNAVAILABLE.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis.asyncio as aioredis

from edgeplex.proto import edgeplex_control_pb2 as pb

P = "edgeplex:"
EVENTS = P + "events"


class Store:
    def __init__(self, url: str) -> None:
        self.redis = aioredis.from_url(
            url, decode_responses=False, socket_connect_timeout=2.0, socket_timeout=5.0
        )

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # --- catalog --------------------------------------------------------------------------

    async def put_model(self, model: pb.CatalogModel) -> None:
        await self.redis.hset(P + "models", model.name, model.SerializeToString())

    async def get_model(self, name: str) -> pb.CatalogModel | None:
        raw = await self.redis.hget(P + "models", name)
        return None if raw is None else pb.CatalogModel.FromString(raw)

    async def models(self) -> list[pb.CatalogModel]:
        raw = await self.redis.hgetall(P + "models")
        return sorted((pb.CatalogModel.FromString(v) for v in raw.values()), key=lambda m: m.name)

    async def remove_model(self, name: str) -> bool:
        return bool(await self.redis.hdel(P + "models", name))

    # --- sites ----------------------------------------------------------------------------

    async def put_site(self, site: pb.Site) -> None:
        await self.redis.hset(P + "sites", site.site_id, site.SerializeToString())

    async def get_site(self, site_id: str) -> pb.Site | None:
        raw = await self.redis.hget(P + "sites", site_id)
        return None if raw is None else pb.Site.FromString(raw)

    async def sites(self) -> list[pb.Site]:
        raw = await self.redis.hgetall(P + "sites")
        return sorted((pb.Site.FromString(v) for v in raw.values()), key=lambda s: s.site_id)

    async def seen(self) -> dict[str, float]:
        pairs = await self.redis.zrange(P + "seen", 0, -1, withscores=True)
        return {_text(k): float(v) for k, v in pairs}  # type: ignore[str-unpack,arg-type]

    async def write_reports(self, reports: Iterable[pb.LoadReport]) -> None:
        """One round trip for a batch of reports: latest report and lease per site."""
        latest = {r.site_id: r for r in reports}
        if not latest:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(P + "reports", mapping={k: r.SerializeToString() for k, r in latest.items()})
            pipe.zadd(P + "seen", {k: r.sent_at or time.time() for k, r in latest.items()})
            await pipe.execute()

    async def touch(self, site_id: str, when: float) -> None:
        await self.redis.zadd(P + "seen", {site_id: when})

    async def reports(self) -> dict[str, pb.LoadReport]:
        raw = await self.redis.hgetall(P + "reports")
        return {_text(k): pb.LoadReport.FromString(v) for k, v in raw.items()}

    # --- demand ---------------------------------------------------------------------------

    async def demand(self) -> tuple[dict[tuple[str, str], float], float]:
        raw = await self.redis.hgetall(P + "demand")
        at = await self.redis.get(P + "demand_at")
        out = {}
        for key, value in raw.items():
            region, _, model = _text(key).partition("|")
            out[(region, model)] = float(value)
        return out, float(at) if at else 0.0

    async def put_demand(self, demand: dict[tuple[str, str], float], at: float) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(P + "demand")
            if demand:
                pipe.hset(P + "demand", mapping={f"{r}|{m}": v for (r, m), v in demand.items()})
            pipe.set(P + "demand_at", repr(at))
            await pipe.execute()

    # --- placement and desired state -------------------------------------------------------

    async def next_version(self) -> int:
        return int(await self.redis.incr(P + "version"))

    async def put_placement(self, placement: pb.Placement) -> None:
        await self.redis.set(P + "placement", placement.SerializeToString())

    async def placement(self) -> pb.Placement | None:
        raw = await self.redis.get(P + "placement")
        return None if raw is None else pb.Placement.FromString(raw)

    async def put_desired(self, desired: pb.DesiredState) -> None:
        await self.redis.hset(P + "desired", desired.site_id, desired.SerializeToString())

    async def desired(self) -> dict[str, pb.DesiredState]:
        raw = await self.redis.hgetall(P + "desired")
        return {_text(k): pb.DesiredState.FromString(v) for k, v in raw.items()}

    # --- events ---------------------------------------------------------------------------

    async def notify(self, what: str) -> None:
        await self.redis.publish(EVENTS, what)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
