"""All control-plane state, in Redis. The only module that knows the key layout,
but for usage (usage_store.py, `Store.usage`):

    edgeplex:models          hash  name -> CatalogModel (protobuf)
    edgeplex:catalog         string  a random value, new whenever the catalog changes
    edgeplex:sites           hash  site -> Site (protobuf: registration, cordon, drain)
    edgeplex:join_tokens     hash  site -> "<sha256 of its join token> <region>"
    edgeplex:join_token_sites  hash  sha256 of a join token -> site
    edgeplex:credentials     string  a random value, new whenever a join token changes
    edgeplex:seen            zset  site -> unix time of its last report (the site lease)
    edgeplex:reports         hash  site -> latest LoadReport (protobuf)
    edgeplex:demand          hash  "region|model" -> EWMA requests/s
    edgeplex:demand_at       string  unix time of the last EWMA update
    edgeplex:demand_hints    hash  "site|region|model" -> when a site was asked for a
                             model it holds nowhere
    edgeplex:forecast        string  the forecaster's state
    edgeplex:placement       string  the current Placement (protobuf)
    edgeplex:version         string  counter of placement versions
    edgeplex:desired         hash  site -> the head of the DesiredState last published
    edgeplex:desired:models  hash  site -> sha256 of that state's models
    edgeplex:peer_token      string  the fleet's peer token
    edgeplex:tenants         string  the tenant table (JSON)
    edgeplex:leader          string  replica id, with a TTL (the leader lease)
    edgeplex:events          pub/sub  "catalog", "sites": wake the placement loop
    edgeplex:durable         string  a counter written before each WAIT for replicas
    edgeplex:batch:jobs      hash  job id -> BatchJob (summary, protobuf)
    edgeplex:batch:<id>:in   hash  shard index -> JSON list of the shard's request bodies
    edgeplex:batch:<id>:out  hash  shard index -> JSON list of its outputs (HSETNX: written once)
    edgeplex:batch:<id>:lease hash shard index -> "<site> <expiry unix time> <attempt>"
    edgeplex:batch:<id>:why  hash  shard index -> its last failure

Values are protobuf bytes from proto/edgeplex_control.proto, never pickle.
Every method is a coroutine that may raise redis.exceptions.ConnectionError
while Redis is down; callers decide whether to retry or to answer UNAVAILABLE.

Redis may be one server or a primary watched by Sentinels (redis_client.py). Then
the writes that must survive a failover (the catalog, sites and join tokens,
tenants, the peer token, usage minutes, batch jobs and their outputs) return only
once a replica has them (`replicated`, Redis's WAIT): an acknowledged write is on
the replica the Sentinels would promote. Everything else (reports, demand,
placement, desired states, leases) is rebuilt within a round and is not waited for.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from redis.exceptions import WatchError

from edgeplex.control_plane.redis_client import NotReplicated, P, as_bytes, connect, text
from edgeplex.control_plane.usage_store import UsageStore
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.tenants import TenantTable

EVENTS = P + "events"
SHORT_WAIT_MS = 100  # how long a WAIT waits while replicas were found missing


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
        self.usage = UsageStore(self.redis, self.replicated)

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

    async def close(self) -> None:
        for client in [self.redis] + ([self._waiter] if self._waiter else []):
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
        return as_bytes(raw or b"[]")

    async def batch_outputs(self, job_id: str) -> dict[int, bytes]:
        raw = await self.redis.hgetall(f"{P}batch:{job_id}:out")
        return {int(text(k)): as_bytes(v) for k, v in raw.items()}

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
