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
    edgeplex:credentials     string  a random value, new whenever a join token changes
    edgeplex:catalog         string  a random value, new whenever the catalog changes
    edgeplex:events          pub/sub  "catalog", "sites": wake the placement loop
    edgeplex:usage:h:<hour>:<site>  string  UsageHour: the site's usage in the hour,
                             summed (hour: its start, unix seconds)
    edgeplex:usage:m:<hour>:<site>  hash  minute start -> UsageReport, while kept
    edgeplex:usage:hours     zset  "<hour>:<site>" -> hour (every hour kept)
    edgeplex:usage:open      zset  "<hour>:<site>" -> hour (hours whose minutes are kept)
    edgeplex:usage:f:<hour>  string  UsageReport: the hour summed over every site, once
                             every site's hour is sealed
    edgeplex:usage:fleet     zset  "<hour>" -> hour (the hours summed so)
    edgeplex:usage:sites:<hour>  set  the sites with usage in the hour
    edgeplex:usage:unsummed  zset  "<hour>" -> hour (hours with a site-hour sealed, not
                             yet summed over the fleet)
    edgeplex:batch:jobs      hash  job id -> BatchJob (summary, protobuf)
    edgeplex:batch:<id>:in   hash  shard index -> JSON list of the shard's request bodies
    edgeplex:batch:<id>:out  hash  shard index -> JSON list of its outputs (HSETNX: written once)
    edgeplex:batch:<id>:lease hash shard index -> "<site> <expiry unix time> <attempt>"

Values are protobuf bytes from proto/edgeplex_control.proto, never pickle.
Every method is a coroutine that may raise redis.exceptions.ConnectionError
while Redis is down; callers decide whether to retry or to answer UNAVAILABLE.

Redis may be one server or a primary watched by Sentinels (`connect`). Then the
writes that must survive a failover (the catalog, sites and join tokens, tenants,
the peer token, usage minutes, batch jobs and their outputs) return only once a
replica has them (`replicated`, Redis's WAIT): an acknowledged write is on the
replica the Sentinels would promote. Everything else (reports, demand, placement,
desired states, leases) is rebuilt within a round and is not waited for.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from edgeplex.control_plane import usage
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.tenants import TenantTable

P = "edgeplex:"
EVENTS = P + "events"


POOL = 32  # Redis connections of one control-plane process for its reads and writes
SHORT_WAIT_MS = 100  # how long a WAIT waits while replicas were found missing
SENTINEL = "redis+sentinel"


class NotReplicated(RedisConnectionError):
    """A write that must survive a failover reached the primary but not enough
    replicas in time: not acknowledged (the caller answers UNAVAILABLE or retries)."""


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The primary's connections as Sentinel names it, bounded like the plain pool
    (a caller waits for a free connection rather than failing)."""


def connect(url: str, size: int = POOL) -> tuple[aioredis.Redis, bool]:
    """A client of the Redis that `url` names, with at most `size` connections, and
    whether Sentinels watch it: `redis://[user:password@]host:port/db`, or
    `redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]` for the
    primary that those Sentinels name `service` (the password is the primary's)."""
    # A restarted Redis leaves the pool's idle connections broken: each command on one
    # reconnects and is retried instead of failing the caller. The pool is bounded: a
    # thousand agents reporting at once wait their turn for one of POOL connections
    # instead of opening a thousand (a burst of connects that overflows Redis's accept
    # queue, and a file descriptor each).
    options: dict[str, Any] = {
        "max_connections": size,
        "timeout": 10.0,  # waiting for a free connection
        "decode_responses": False,
        "socket_connect_timeout": 2.0,
        "socket_timeout": 5.0,
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    scheme, _, rest = url.partition("://")
    if scheme != SENTINEL:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        return aioredis.Redis.from_pool(pool), False
    where, _, path = rest.partition("/")
    credentials, _, hosts = where.rpartition("@")
    user, _, password = credentials.partition(":")
    service, _, db = path.partition("/")
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit() or not service:
            raise ValueError(
                f"redis URL {url!r}: expected {SENTINEL}://host:port[,host:port...]/service[/db]"
            )
        sentinels.append((name.strip("[]"), int(port)))
    manager = Sentinel(sentinels, socket_connect_timeout=2.0, socket_timeout=2.0)
    client = manager.master_for(
        urllib.parse.unquote(service),
        connection_pool_class=_BlockingSentinelPool,
        db=int(db or 0),
        username=urllib.parse.unquote(user) or None,
        password=urllib.parse.unquote(password) or None,
        **options,
    )
    return client, True


class Store:
    def __init__(self, url: str, wait_replicas: int | None = None, wait_ms: int = 2000) -> None:
        """`wait_replicas`: replicas that must have a write that has to survive a
        failover (catalog, sites, tenants, usage, batch jobs) before it is
        acknowledged; None: one when Sentinels watch the primary, else none."""
        self.url = url
        self.redis, watched = connect(url)
        self.wait_replicas = (1 if watched else 0) if wait_replicas is None else wait_replicas
        self.wait_ms = wait_ms
        # WAITs block their connection until replicas answer (all of wait_ms while none
        # is there, as in a failover): on a connection of their own, so that durable
        # writes cannot take connections from reads, reports and the leader lease.
        self._waiter = connect(url, 1)[0] if self.wait_replicas else None
        self._wait_lock = asyncio.Lock()
        self._next_wait: asyncio.Future[tuple[int, int]] | None = None  # not yet started
        self._replicas_missing = False  # the last WAIT found too few
        self._waits: set[asyncio.Task[None]] = set()
        self._own: list[aioredis.Redis] = []

    async def replicated(self) -> None:
        """Returns once `wait_replicas` replicas have every write made so far, on any
        connection (replication is one ordered stream: a replica that has a write
        made after ours has ours); NotReplicated if they do not within `wait_ms`.

        Callers share WAITs: one is in flight at a time, and every caller that came
        while it ran joins the next, which starts after their writes. So a burst of
        durable writes costs a few WAITs, not one each; and while no replica is
        there (a failover) they are all refused after one wait, not one after
        another."""
        if self._waiter is None:
            return
        shared = self._next_wait
        if shared is None:
            shared = self._next_wait = asyncio.get_running_loop().create_future()
            shared.add_done_callback(lambda f: f.exception())  # read, if all callers left
            task = asyncio.create_task(self._wait(shared))
            self._waits.add(task)
            task.add_done_callback(self._waits.discard)
        acked, wait_ms = await asyncio.shield(shared)
        if acked < self.wait_replicas:
            raise NotReplicated(
                f"Redis: {acked} of {self.wait_replicas} replicas have the write after {wait_ms} ms"
            )

    async def _wait(self, shared: asyncio.Future[tuple[int, int]]) -> None:
        assert self._waiter is not None
        async with self._wait_lock:  # the WAIT before it is done: it starts now
            self._next_wait = None  # callers from here on join the next one
            # While replicas were missing at the last WAIT, wait only briefly: a
            # replica back in sync answers within it, and callers refused retry.
            wait_ms = SHORT_WAIT_MS if self._replicas_missing else self.wait_ms
            try:
                async with self._waiter.pipeline(transaction=False) as pipe:
                    pipe.incr(P + "durable")  # a write after the callers', to wait for
                    pipe.wait(self.wait_replicas, wait_ms)
                    _, acked = await pipe.execute()
            except Exception as exc:  # every caller waiting on it gets it
                shared.set_exception(exc)
                return
            self._replicas_missing = acked < self.wait_replicas
            shared.set_result((acked, wait_ms))

    def own_client(self) -> aioredis.Redis:
        """A client with a connection of its own (the leader lease: renewed on time
        whatever else waits for Redis); closed with the store."""
        client = connect(self.url, 1)[0]
        self._own.append(client)
        return client

    async def close(self) -> None:
        for client in [self.redis, *self._own] + ([self._waiter] if self._waiter else []):
            await client.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # --- catalog --------------------------------------------------------------------------

    async def put_model(self, model: pb.CatalogModel) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(P + "models", model.name, model.SerializeToString())
            pipe.set(P + "catalog", secrets.token_hex(8))
            await pipe.execute()
        await self.replicated()

    async def get_model(self, name: str) -> pb.CatalogModel | None:
        raw = await self.redis.hget(P + "models", name)
        return None if raw is None else pb.CatalogModel.FromString(raw)

    async def models(self) -> list[pb.CatalogModel]:
        raw = await self.redis.hgetall(P + "models")
        return sorted((pb.CatalogModel.FromString(v) for v in raw.values()), key=lambda m: m.name)

    async def remove_model(self, name: str) -> bool:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(P + "models", name)
            pipe.set(P + "catalog", secrets.token_hex(8))
            removed, _ = await pipe.execute()
        await self.replicated()
        return bool(removed)

    async def catalog_epoch(self) -> bytes | None:
        """A value that changes with every catalog write: the catalog read last is
        still the catalog while it stays the same."""
        return await self._epoch("catalog")

    async def _epoch(self, key: str) -> bytes | None:
        """The random value written beside every write of what `key` names."""
        raw = await self.redis.get(P + key)
        return raw if isinstance(raw, bytes) else None

    # --- sites ----------------------------------------------------------------------------

    async def put_site(self, site: pb.Site) -> None:
        await self.redis.hset(P + "sites", site.site_id, site.SerializeToString())
        await self.replicated()

    async def get_site(self, site_id: str) -> pb.Site | None:
        raw = await self.redis.hget(P + "sites", site_id)
        return None if raw is None else pb.Site.FromString(raw)

    async def sites(self) -> list[pb.Site]:
        raw = await self.redis.hgetall(P + "sites")
        return sorted((pb.Site.FromString(v) for v in raw.values()), key=lambda s: s.site_id)

    async def put_join_token(self, site_id: str, region: str, digest: str) -> None:
        """The site's join token (its sha256) and region; replaces and revokes any
        earlier token of the site."""
        old = await self.join_token(site_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            if old is not None:
                pipe.hdel(P + "join_token_sites", old[0])
            pipe.hset(P + "join_tokens", site_id, f"{digest} {region}")
            pipe.hset(P + "join_token_sites", digest, site_id)
            pipe.set(P + "credentials", secrets.token_hex(8))
            await pipe.execute()
        await self.replicated()

    async def credentials_epoch(self) -> bytes | None:
        """A value that changes whenever any join token does (and is gone when Redis
        lost its data): report streams recheck their site when it moves."""
        return await self._epoch("credentials")

    async def join_token(self, site_id: str) -> tuple[str, str] | None:
        """(sha256 of the site's join token, its region), or None."""
        raw = await self.redis.hget(P + "join_tokens", site_id)
        if raw is None:
            return None
        digest, _, region = text(raw).partition(" ")
        return digest, region

    async def site_regions(self) -> dict[str, str]:
        """Every site that may join, with its region."""
        raw = await self.redis.hgetall(P + "join_tokens")
        return {text(k): text(v).partition(" ")[2] for k, v in raw.items()}

    async def join_token_owner(self, digest: str) -> str | None:
        raw = await self.redis.hget(P + "join_token_sites", digest)
        return None if raw is None else text(raw)

    async def seen(self) -> dict[str, float]:
        pairs = await self.redis.zrange(P + "seen", 0, -1, withscores=True)
        return {text(k): float(v) for k, v in pairs}  # type: ignore[str-unpack,arg-type]

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
        return {text(k): pb.LoadReport.FromString(v) for k, v in raw.items()}

    # --- demand ---------------------------------------------------------------------------

    async def demand(self) -> tuple[dict[tuple[str, str], float], float]:
        raw = await self.redis.hgetall(P + "demand")
        at = await self.redis.get(P + "demand_at")
        out = {}
        for key, value in raw.items():
            region, _, model = text(key).partition("|")
            out[(region, model)] = float(value)
        return out, float(at) if at else 0.0

    async def put_demand(self, demand: dict[tuple[str, str], float], at: float) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(P + "demand")
            if demand:
                pipe.hset(P + "demand", mapping={f"{r}|{m}": v for (r, m), v in demand.items()})
            pipe.set(P + "demand_at", repr(at))
            await pipe.execute()

    async def put_demand_hint(self, site_id: str, region: str, model: str, at: float) -> None:
        """A site was asked for `model` (from `region`) and holds it nowhere."""
        await self.redis.hset(P + "demand_hints", f"{site_id}|{region}|{model}", repr(at))

    async def demand_hints(self, since: float) -> list[tuple[str, str, str]]:
        """(site, region, model) hinted after `since`; older hints are dropped."""
        raw = await self.redis.hgetall(P + "demand_hints")
        fresh: list[tuple[str, str, str]] = []
        stale: list[tuple[str, str, str]] = []
        for key, value in raw.items():
            site, region, model = text(key).split("|", 2)
            (fresh if float(value) > since else stale).append((site, region, model))
        if stale:
            await self.redis.hdel(P + "demand_hints", *("|".join(h) for h in stale))
        return fresh

    async def put_forecast(self, state: bytes) -> None:
        await self.redis.set(P + "forecast", state)

    async def forecast(self) -> bytes | None:
        raw = await self.redis.get(P + "forecast")
        return raw if isinstance(raw, bytes) else None

    # --- placement and desired state -------------------------------------------------------

    async def next_version(self) -> int:
        """A version above every earlier one, even after Redis lost its data: the
        clock in microseconds is its floor (agents drop what is not above the last
        version they accepted, so a reset counter would lock them out)."""
        floor = time.time_ns() // 1000
        return int(await self.redis.eval(_NEXT_VERSION, 1, P + "version", floor))

    async def peer_token(self) -> str:
        """The fleet's peer token (created once): what forwarding sites present so
        that their hop headers are honoured. Carried in each signed desired state."""
        if await self.redis.set(P + "peer_token", secrets.token_urlsafe(24), nx=True):
            await self.replicated()
        token = await self.redis.get(P + "peer_token")
        return text(token) if token is not None else ""

    # --- tenants ----------------------------------------------------------------------

    async def tenants(self) -> TenantTable:
        raw = await self.redis.get(P + "tenants")
        return TenantTable.parse(json.loads(raw)) if raw else TenantTable()

    async def change_tenants(self, change: Callable[[TenantTable], TenantTable]) -> TenantTable:
        """Apply `change` to the tenant table atomically (retried if another admin
        call changed it meanwhile); returns the table stored."""
        key = P + "tenants"
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    changed = change(TenantTable.parse(json.loads(raw)) if raw else TenantTable())
                    pipe.multi()
                    pipe.set(key, json.dumps(changed.dump()))
                    await pipe.execute()
                    break
                except WatchError:
                    continue
        await self.replicated()
        return changed

    # --- usage ------------------------------------------------------------------------

    async def put_usage(self, report: pb.UsageReport) -> bool:
        """A site's minute of usage records, added to the site's hour and kept under
        (site, hour, minute) while the hour's minutes are kept: stored again, it
        replaces itself. Once the hour is sealed (its minutes dropped, `trim_usage`) a
        minute it holds is not added again. False when it was already counted so."""
        start, hour = usage.start_of(report), usage.hour_of(report)
        offset = start - hour  # what the hour's list of minutes holds
        member = f"{hour}:{report.site_id}"
        hour_key, minutes_key = P + "usage:h:" + member, P + "usage:m:" + member
        fleet_key = P + f"usage:f:{hour}"
        day_start = hour - hour % usage.DAY_S
        day_key = P + f"usage:d:{day_start}:{report.site_id}"
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(hour_key, minutes_key, fleet_key, day_key)
                    raw, summed, day_raw = await pipe.mget(hour_key, fleet_key, day_key)
                    kept = pb.UsageHour.FromString(raw) if raw is not None else pb.UsageHour()
                    # An hour summed over the fleet has every site's hour sealed, a
                    # site's day summed every hour of its day: a site's first minute
                    # in such an hour comes sealed, and adds to every sum.
                    fleet = pb.UsageReport.FromString(summed) if summed is not None else None
                    day = pb.UsageReport.FromString(day_raw) if day_raw is not None else None
                    was_sealed = kept.sealed
                    kept.sealed = kept.sealed or fleet is not None or day is not None
                    if offset in kept.minutes:
                        if kept.sealed:  # sent again after its minutes were dropped
                            await pipe.reset()
                            return False
                        # Sent again: the hour is summed anew, with this copy in place.
                        stored = await pipe.hgetall(minutes_key)
                        stored[str(start).encode()] = report.SerializeToString()
                        reports = [pb.UsageReport.FromString(v) for v in stored.values()]
                        kept.sum.CopyFrom(usage.hour_sum(report.site_id, hour, reports))
                    else:
                        if not kept.HasField("sum"):
                            kept.sum.CopyFrom(usage.hour_sum(report.site_id, hour, ()))
                        usage.add(kept.sum, report)
                        kept.minutes.append(offset)
                        for total in (fleet, day):
                            if total is not None:
                                usage.add(total, report)
                    pipe.multi()
                    if not kept.sealed:
                        pipe.hset(minutes_key, str(start), report.SerializeToString())
                        pipe.zadd(P + "usage:open", {member: hour})
                    elif not was_sealed:  # the hour comes sealed: summed in turn
                        if fleet is None:
                            pipe.zadd(P + "usage:unsummed", {str(hour): hour})
                        if day is None:
                            pipe.zadd(P + "usage:undayed", _site_days([member]))
                    pipe.set(hour_key, kept.SerializeToString())
                    pipe.zadd(P + "usage:hours", {member: hour})
                    pipe.sadd(P + f"usage:sites:{hour}", report.site_id)
                    pipe.incr(P + f"usage:v:{hour}")  # readers' caches of the hour go stale
                    if fleet is not None:
                        pipe.set(fleet_key, fleet.SerializeToString())
                    if day is not None:
                        pipe.set(day_key, day.SerializeToString())
                        if raw is None:  # one more site-hour the day holds
                            pipe.incr(P + f"usage:dh:{day_start}")
                    await pipe.execute()
                    break
                except WatchError:
                    continue
        await self.replicated()
        return True

    async def usage_versions(self, hours: list[int]) -> list[int]:
        """Each hour's count of minutes stored in it (0: none since this count began):
        a cache of what an hour holds is current while its count has not moved."""
        raws = await self.redis.mget([P + f"usage:v:{hour}" for hour in hours])
        return [int(raw) if raw is not None else 0 for raw in raws]

    async def usage_reports(
        self, from_time: float, to_time: float, fleet: bool = False, days: bool = False
    ) -> list[pb.UsageReport]:
        """Every report of `usage_parts`, in one list."""
        parts = self.usage_parts(from_time, to_time, fleet, days)
        return [report async for part in parts for report in part]

    async def usage_parts(
        self, from_time: float, to_time: float, fleet: bool = False, days: bool = False
    ) -> AsyncIterator[list[pb.UsageReport]]:
        """Reports that cover [from_time, to_time) (0: no end) exactly, a part at a
        time: the minutes of each hour that either end cuts, then the sum of each
        site's hour that lies wholly inside; with `fleet` (for rows not by site),
        an hour summed over the fleet in place of its sites'; with `days` (for rows
        by site; not with `fleet`), a site's UTC day summed in place of its hours.
        The site-hours a sum holds are not listed: a month of a large fleet lists
        only the hours not summed yet. UsageGone, before any part, when a cut hour's
        minutes are no longer kept."""
        assert not (fleet and days), "a fleet's hour and a site's day overlap"
        end = to_time or math.inf
        sums: list[str] = []  # keys of the sums read in place of site-hours
        held: set[str] = set()  # the site-days `sums` hold ("<day>:<site>")
        covered: list[tuple[int, int]] = []  # spans every site-hour of which a sum holds
        if fleet:  # an hour summed over the fleet holds every site's hour in it
            listed = await self.redis.zrangebyscore(P + "usage:fleet", from_time, _below(end))
            hours = [int(h) for h in _names(listed) if int(h) + usage.HOUR_S <= end]
            sums = [P + f"usage:f:{hour}" for hour in hours]
            covered = [(hour, hour + usage.HOUR_S) for hour in hours]
        elif days:
            held, covered = await self._summed_days(from_time, end)
            sums = [P + "usage:d:" + member for member in sorted(held)]
        # Listed after the sums: a sum made meanwhile holds hours read from their
        # sites (their sums stay), never from both.
        whole: list[str] = []  # members of the site-hours wholly inside the range
        cut: list[str] = []  # and of those either end cuts
        for lo, hi in _gaps(from_time - from_time % usage.HOUR_S, end, covered):
            found = await self.redis.zrangebyscore(P + "usage:hours", lo, _below(hi))
            for member in _names(found):
                hour = int(member.partition(":")[0])
                if from_time <= hour and hour + usage.HOUR_S <= end:
                    if not held or _day_of(member) not in held:
                        whole.append(member)
                else:
                    cut.append(member)
        minutes: list[pb.UsageReport] = []  # at most two hours of minutes a site
        for chunk in _chunks(cut, 500):
            async with self.redis.pipeline(transaction=True) as pipe:
                for member in chunk:
                    pipe.get(P + "usage:h:" + member)
                    pipe.hvals(P + "usage:m:" + member)
                replies = await pipe.execute()
            for member, raw, kept in zip(chunk, replies[::2], replies[1::2], strict=True):
                if raw is not None and pb.UsageHour.FromString(raw).sealed:
                    hour = int(member.partition(":")[0])
                    at = datetime.datetime.fromtimestamp(hour, datetime.UTC)
                    raise usage.UsageGone(
                        f"the minutes of {at:%Y-%m-%dT%H:00Z} are no longer kept, only its "
                        "hourly sums: give from and to on the hour"
                    )
                minutes.extend(pb.UsageReport.FromString(r) for r in kept)
        if minutes:
            yield minutes
        for chunk in _chunks(sums, 1000):
            raws = await self.redis.mget(chunk)
            yield [pb.UsageReport.FromString(raw) for raw in raws if raw is not None]
            # A site's day dropped meanwhile with its first hour (usage_kept_days): the
            # hours it held that are still kept, read one by one.
            for key, raw in zip(chunk, raws, strict=True):
                if raw is None and held:  # (held: the sums are sites' days)
                    day, _, site = key.removeprefix(P + "usage:d:").partition(":")
                    held_hours = [int(day) + h * usage.HOUR_S for h in range(24)]
                    whole += [f"{h}:{site}" for h in held_hours if h + usage.HOUR_S <= end]
        for chunk in _chunks(whole, 1000):
            raws = await self.redis.mget([P + "usage:h:" + m for m in chunk])
            yield [pb.UsageHour.FromString(raw).sum for raw in raws if raw is not None]

    async def _summed_days(
        self, from_time: float, end: float
    ) -> tuple[set[str], list[tuple[int, int]]]:
        """The site-days summed wholly inside [from_time, end), and the days every
        site-hour of which they hold (the site-hours a day holds, `usage:dh:<day>`,
        against the site-hours listed in it), read as one snapshot."""
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(P + "usage:days")
                    listed = await pipe.zrangebyscore(P + "usage:days", from_time, _below(end))
                    held = {
                        d for d in _names(listed) if int(d.partition(":")[0]) + usage.DAY_S <= end
                    }
                    days = sorted({int(d.partition(":")[0]) for d in held})
                    pipe.multi()
                    for day in days:
                        pipe.zcount(P + "usage:hours", day, day + usage.DAY_S - usage.HOUR_S)
                        pipe.get(P + f"usage:dh:{day}")
                    replies = await pipe.execute()
                    break
                except WatchError:
                    continue
        counts = zip(days, replies[::2], replies[1::2], strict=True)
        covered = [(day, day + usage.DAY_S) for day, n, dh in counts if dh and int(dh) == n]
        return held, covered

    async def trim_usage(self, now: float, minutes_kept_s: float, kept_s: float) -> tuple[int, int]:
        """Seal the hours that ended more than `minutes_kept_s` ago (drop their
        minutes; their sums stay), sum each hour whose every site is sealed over the
        fleet, and drop the hours that ended more than `kept_s` ago; at most 10,000
        site-hours of each a call. Returns (sealed, dropped)."""
        sealed = 0
        ended = now - minutes_kept_s - usage.HOUR_S
        for member in _names(
            await self.redis.zrangebyscore(P + "usage:open", "-inf", ended, start=0, num=10_000)
        ):
            hour_key = P + "usage:h:" + member
            async with self.redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        await pipe.watch(hour_key)
                        raw = await pipe.get(hour_key)
                        pipe.multi()
                        if raw is not None:
                            kept = pb.UsageHour.FromString(raw)
                            kept.sealed = True
                            pipe.set(hour_key, kept.SerializeToString())
                        pipe.delete(P + "usage:m:" + member)
                        pipe.zrem(P + "usage:open", member)
                        hour = int(member.partition(":")[0])
                        pipe.zadd(P + "usage:unsummed", {str(hour): hour})
                        pipe.zadd(P + "usage:undayed", _site_days([member]))
                        await pipe.execute()
                        break
                    except WatchError:
                        continue
            sealed += 1
        # Each hour with a site-hour sealed is summed once every site's is; one that
        # is not yet, or whose summing lost to sites arriving, is tried again here.
        for hour in map(int, _names(await self.redis.zrange(P + "usage:unsummed", 0, 999))):
            await self._sum_fleet_hour(hour)
        days_summed = 0
        # A site's day is summed once it ended before minutes stopped being kept
        # (no minute can come to it unsealed) and every hour of it is sealed.
        for member in _names(
            await self.redis.zrangebyscore(
                P + "usage:undayed", "-inf", ended - usage.DAY_S + usage.HOUR_S, start=0, num=1000
            )
        ):
            days_summed += await self._sum_site_day(member)
        old = _names(
            await self.redis.zrangebyscore(
                P + "usage:hours", "-inf", now - kept_s - usage.HOUR_S, start=0, num=10_000
            )
        )
        for chunk in _chunks(old, 1000):
            gone = sorted({m.partition(":")[0] for m in chunk})
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(*(P + "usage:h:" + m for m in chunk))
                pipe.delete(*(P + "usage:m:" + m for m in chunk))
                pipe.delete(*(P + "usage:f:" + h for h in gone))
                pipe.delete(*(P + "usage:sites:" + h for h in gone))
                pipe.delete(*(P + "usage:v:" + h for h in gone))
                pipe.zrem(P + "usage:hours", *chunk)
                pipe.zrem(P + "usage:open", *chunk)
                pipe.zrem(P + "usage:fleet", *gone)
                pipe.zrem(P + "usage:unsummed", *gone)
                await pipe.execute()
        # A site's day goes with its first hour; the rest are read by the hour.
        gone_before = now - kept_s - usage.HOUR_S
        old_days = _names(
            await self.redis.zrangebyscore(
                P + "usage:days", "-inf", gone_before, start=0, num=10_000
            )
        )
        for chunk in _chunks(old_days, 1000):
            gone_days = sorted({d.partition(":")[0] for d in chunk})
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(*(P + "usage:d:" + d for d in chunk))
                pipe.delete(*(P + "usage:dh:" + d for d in gone_days))
                pipe.zrem(P + "usage:days", *chunk)
                await pipe.execute()
        await self.redis.zremrangebyscore(P + "usage:undayed", "-inf", gone_before)
        if sealed or old or days_summed:
            await self.replicated()
        return sealed, len(old)

    async def _sum_fleet_hour(self, hour: int, tries: int = 5) -> bool:
        """The hour summed over every site once every site's hour in it is sealed
        (then it leaves `usage:unsummed`); False while one is not, or if sites kept
        arriving while it was summed: it is tried again at the next trim, and read
        from its sites meanwhile."""
        fleet_key, sites_key = P + f"usage:f:{hour}", P + f"usage:sites:{hour}"
        for _ in range(tries):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(fleet_key, sites_key)  # a site's first minute: SADD
                    if await pipe.exists(fleet_key):
                        await pipe.reset()
                        await self.redis.zrem(P + "usage:unsummed", str(hour))
                        return True
                    if await pipe.zcount(P + "usage:open", hour, hour):
                        return False
                    sites = sorted(_names(await pipe.smembers(sites_key)))
                    keys = [P + f"usage:h:{hour}:{site}" for site in sites]
                    if keys:
                        await pipe.watch(*keys)  # a minute sent late to a sealed hour
                    raws = await pipe.mget(keys) if keys else []
                    sums = [pb.UsageHour.FromString(raw).sum for raw in raws if raw]
                    total = usage.hour_sum("", hour, sums)
                    pipe.multi()
                    pipe.set(fleet_key, total.SerializeToString())
                    pipe.zadd(P + "usage:fleet", {str(hour): hour})
                    pipe.zrem(P + "usage:unsummed", str(hour))
                    await pipe.execute()
                    return True
                except WatchError:
                    continue
        return False

    async def _sum_site_day(self, member: str, tries: int = 5) -> bool:
        """A site's UTC day ("<day>:<site>") summed from its hours when every one of
        them is sealed; one that is not yet lists the day again when it is sealed. A
        minute sent meanwhile is tried again (WATCH on every hour of the day). True
        when it summed the day."""
        day, _, site = member.partition(":")
        day_key = P + "usage:d:" + member
        hour_keys = [P + f"usage:h:{int(day) + h * usage.HOUR_S}:{site}" for h in range(24)]
        for _ in range(tries):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(day_key, *hour_keys)
                    summed = await pipe.exists(day_key)
                    hours = [pb.UsageHour.FromString(r) for r in await pipe.mget(hour_keys) if r]
                    pipe.multi()
                    ready = not summed and hours and all(hour.sealed for hour in hours)
                    if ready:
                        total = usage.day_sum(site, int(day), (hour.sum for hour in hours))
                        pipe.set(day_key, total.SerializeToString())
                        pipe.zadd(P + "usage:days", {member: int(day)})
                        pipe.incrby(P + f"usage:dh:{day}", len(hours))
                    pipe.zrem(P + "usage:undayed", member)
                    await pipe.execute()
                    return bool(ready)
                except WatchError:
                    continue
        return False

    async def list_days_to_sum(self) -> int:
        """Once (a marker records it): every site's day that has hours listed to be
        summed at the trims to come, for the hours a control plane sealed before it
        summed days. Returns how many site-days were listed."""
        if await self.redis.exists(P + "usage:days:listed"):
            return 0
        listed, cursor = 0, 0
        while True:
            cursor, found = await self.redis.zscan(P + "usage:hours", cursor, count=5000)
            days = _site_days(_names(m for m, _ in found))
            if days:
                await self.redis.zadd(P + "usage:undayed", days)
                listed += len(days)
            if cursor == 0:
                break
        await self.redis.set(P + "usage:days:listed", "1")
        return listed

    async def migrate_usage(self) -> int:
        """Minutes an earlier control plane kept in one hash (`usage`, with its index
        `usage:minutes`), moved into their hours; returns how many were moved."""
        moved = 0
        while True:
            _, found = await self.redis.hscan(P + "usage", 0, count=500)
            assert isinstance(found, dict)  # field -> value (no_values not asked)
            if not found:
                await self.redis.delete(P + "usage:minutes")
                return moved
            for raw in found.values():
                await self.put_usage(pb.UsageReport.FromString(_bytes(raw)))
            names = list(found)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(P + "usage", *names)
                pipe.zrem(P + "usage:minutes", *names)
                await pipe.execute()
            moved += len(names)

    async def put_placement(self, placement: pb.Placement) -> None:
        await self.redis.set(P + "placement", placement.SerializeToString())

    async def placement(self) -> pb.Placement | None:
        raw = await self.redis.get(P + "placement")
        return None if raw is None else pb.Placement.FromString(raw)

    async def put_desired_many(self, sent: dict[str, tuple[bytes, bytes]]) -> None:
        """What sites were sent, in one write: per site its desired state's head (a
        DesiredState without its models, which the placement holds) and the sha256 of
        its models' bytes, so that a new leader can tell what changed and send what
        did not byte for byte."""
        if sent:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(P + "desired", mapping={s: head for s, (head, _) in sent.items()})
                pipe.hset(P + "desired:models", mapping={s: d for s, (_, d) in sent.items()})
                await pipe.execute()

    async def desired(self) -> dict[str, tuple[bytes, bytes]]:
        """Per site, the head and models' sha256 `put_desired_many` stored. States an
        earlier release stored whole have no sha256 and are left out (sent anew)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(P + "desired")
            pipe.hgetall(P + "desired:models")
            heads, digests = await pipe.execute()
        return {
            text(site): (head, digests[site]) for site, head in heads.items() if site in digests
        }

    # --- batch jobs -----------------------------------------------------------------------

    async def put_batch(self, job: pb.BatchJob, shards: list[bytes]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(f"{P}batch:{job.job_id}:in", mapping=dict(enumerate(shards)))
            pipe.hset(P + "batch:jobs", job.job_id, job.SerializeToString())
            await pipe.execute()
        await self.replicated()

    async def update_batch(self, job: pb.BatchJob) -> None:
        await self.redis.hset(P + "batch:jobs", job.job_id, job.SerializeToString())
        await self.replicated()

    async def batch_jobs(self) -> list[pb.BatchJob]:
        raw = await self.redis.hgetall(P + "batch:jobs")
        return [pb.BatchJob.FromString(v) for v in raw.values()]

    async def get_batch(self, job_id: str) -> pb.BatchJob | None:
        raw = await self.redis.hget(P + "batch:jobs", job_id)
        return None if raw is None else pb.BatchJob.FromString(raw)

    async def batch_shard(self, job_id: str, index: int) -> bytes:
        raw = await self.redis.hget(f"{P}batch:{job_id}:in", str(index))
        return _bytes(raw or b"[]")

    async def batch_outputs(self, job_id: str) -> dict[int, bytes]:
        raw = await self.redis.hgetall(f"{P}batch:{job_id}:out")
        return {int(text(k)): _bytes(v) for k, v in raw.items()}

    async def batch_done_shards(self, job_id: str) -> set[int]:
        keys = await self.redis.hkeys(f"{P}batch:{job_id}:out")
        return {int(text(k)) for k in keys}

    async def put_batch_output(self, job_id: str, index: int, outputs: bytes) -> bool:
        """Record a shard's outputs unless some run of it already did (no duplicates)."""
        stored = bool(await self.redis.hsetnx(f"{P}batch:{job_id}:out", str(index), outputs))
        await self.replicated()  # also when another run stored it: it is then kept
        return stored

    async def drop_batch(self, job_id: str) -> None:
        """Forget a job and everything it stored (its inputs, results, leases)."""
        keys = [f"{P}batch:{job_id}:{part}" for part in ("in", "out", "lease", "why")]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(*keys)
            pipe.hdel(P + "batch:jobs", job_id)
            await pipe.execute()
        await self.replicated()

    async def batch_leases(self, job_id: str) -> dict[int, ShardLease]:
        raw = await self.redis.hgetall(f"{P}batch:{job_id}:lease")
        return {int(text(k)): ShardLease.parse(text(v)) for k, v in raw.items()}

    async def lease_batch_shard(self, job_id: str, index: int, old: str, new: ShardLease) -> bool:
        """Compare-and-set: write `new` only if the lease is still `old` (its raw value,
        "" when there was none). False when another replica got there first."""
        done = await self.redis.eval(
            _CAS, 1, f"{P}batch:{job_id}:lease", str(index), old, new.format()
        )
        return bool(done)

    async def batch_failure(self, job_id: str, index: int, reason: str | None = None) -> str:
        """The last failure of a shard (recorded when `reason` is given)."""
        key = f"{P}batch:{job_id}:why"
        if reason is not None:
            await self.redis.hset(key, str(index), reason[:500])
            return reason
        raw = await self.redis.hget(key, str(index))
        return "" if raw is None else text(raw)

    # --- events ---------------------------------------------------------------------------

    async def notify(self, what: str) -> None:
        await self.redis.publish(EVENTS, what)


_CAS = """
local current = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if current ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

_NEXT_VERSION = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
local next = math.max(current + 1, floor)
redis.call('SET', KEYS[1], string.format('%d', next))
return next
"""


@dataclass(frozen=True)
class ShardLease:
    """Who runs a batch shard, until when, which attempt, for which replica."""

    site: str
    expiry: float
    attempt: int
    holder: str = ""

    def format(self) -> str:
        return f"{self.site} {self.expiry!r} {self.attempt} {self.holder}".rstrip()

    @classmethod
    def parse(cls, raw: str) -> ShardLease:
        parts = raw.split()
        holder = parts[3] if len(parts) > 3 else ""
        return cls(parts[0], float(parts[1]), int(parts[2]), holder)


def _below(end: float) -> str:
    """A score range's exclusive upper end, for ZRANGEBYSCORE."""
    return f"({end}" if math.isfinite(end) else "+inf"


def _gaps(start: float, end: float, covered: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """The spans of [start, end) that none of `covered` (sorted) holds."""
    gaps: list[tuple[float, float]] = []
    at = start
    for lo, hi in covered:
        if lo > at:
            gaps.append((at, lo))
        at = max(at, hi)
    if at < end:
        gaps.append((at, end))
    return gaps


def _day_of(member: str) -> str:
    """The site's day ("<day>:<site>") of a site's hour ("<hour>:<site>")."""
    hour, _, site = member.partition(":")
    return f"{int(hour) - int(hour) % usage.DAY_S}:{site}"


def _site_days(members: Iterable[str]) -> dict[str, int]:
    """The site-days of site-hours, each with its day's start (its score in the
    lists of days)."""
    days = {_day_of(member) for member in members}
    return {day: int(day.partition(":")[0]) for day in days}


def _names(reply: Any) -> list[str]:
    """The members a Redis range reply lists (no scores asked), as str."""
    return [text(member) for member in reply]


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for at in range(0, len(items), size):
        yield items[at : at + size]


def text(value: bytes | str) -> str:
    """A Redis reply as str (the client returns bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value
