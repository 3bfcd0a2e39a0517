"""The asynchronous Batch API: jobs durable in Redis, shards run at idle sites.

A job is its request bodies split into shards (store.py keys `batch:*`). On the
leader, `BatchRunner.run` wakes every TICK_S and, for every shard of a
running job that has no output and no live lease, picks a site
(`pick_site`: up, not draining, utilisation under `IDLE_UTILIZATION`,
preferring sites where it is local night, then the model already loaded, then
the least busy), takes a lease on it with compare-and-set (two replicas never
both win it), and sends the shard's requests to that site's OIP HTTP endpoint
one by one, renewing the lease while it runs. The outputs of a shard are
written with HSETNX when all its items are done, so a shard run twice (its
lease expired while a replica was dying) is recorded once: a control-plane
restart loses no shard and duplicates none. A replica that stops leading
cancels its runs at once. A run that fails records why and gives its lease
up; the shard runs again elsewhere, and after MAX_ATTEMPTS failed runs its
items fail with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace

import aiohttp
from redis.exceptions import RedisError

from edgeplex.control_plane.leader import LeaderLease
from edgeplex.control_plane.store import ShardLease, Store
from edgeplex.proto import edgeplex_control_pb2 as pb

log = logging.getLogger("edgeplex.control_plane.batch")

DEFAULT_SHARD_SIZE = 32
SHARD_LEASE_S = 15.0  # renewed every third of it while the shard runs
MAX_ATTEMPTS = 3
TICK_S = 0.5
IDLE_UTILIZATION = 0.5
MAX_SHARDS_PER_SITE = 1
NIGHT = (22, 6)  # local hours [22:00, 06:00)
# A result larger than this is recorded as an error in its place: results live in
# Redis beside the fleet's state, which one job must not fill.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
RESULTS_TTL_S = 7 * 24 * 3600.0  # a finished or cancelled job and its results, then gone


@dataclass(frozen=True)
class SiteLoad:
    site_id: str
    region: str
    http_address: str
    up: bool
    draining: bool
    utilization: float
    loaded: frozenset[str]


def is_night(region: str, offsets_h: dict[str, float], now: float) -> bool:
    hour = (now / 3600 + offsets_h.get(region, 0.0)) % 24
    start, end = NIGHT
    return hour >= start or hour < end


def pick_site(
    sites: Iterable[SiteLoad],
    model: str,
    busy: dict[str, int],
    offsets_h: dict[str, float],
    now: float,
) -> SiteLoad | None:
    """The site for the next shard of `model`, or None when no site is idle. Pure.
    A site that registered no HTTP address cannot take one (shards are HTTP calls)."""
    idle = [
        s
        for s in sites
        if s.up
        and s.http_address
        and not s.draining
        and s.utilization < IDLE_UTILIZATION
        and busy.get(s.site_id, 0) < MAX_SHARDS_PER_SITE
    ]
    if not idle:
        return None
    return min(
        idle,
        key=lambda s: (
            not is_night(s.region, offsets_h, now),
            model not in s.loaded,
            s.utilization + busy.get(s.site_id, 0),
            s.site_id,
        ),
    )


def make_job(model: str, inputs: list[str], shard_size: int) -> tuple[pb.BatchJob, list[bytes]]:
    """A new job and its shards; raises ValueError for an input that is not JSON."""
    for i, body in enumerate(inputs):
        try:
            doc = json.loads(body)
        except ValueError:
            raise ValueError(f"input {i} is not JSON") from None
        if not isinstance(doc, dict) or "inputs" not in doc:
            raise ValueError(f"input {i}: expected an OIP request body with 'inputs'")
    size = shard_size or DEFAULT_SHARD_SIZE
    shards = [json.dumps(inputs[i : i + size]).encode() for i in range(0, len(inputs), size)]
    job = pb.BatchJob(
        job_id=uuid.uuid4().hex[:16],
        model=model,
        state="RUNNING" if shards else "DONE",
        items=len(inputs),
        shards=len(shards),
        created_at=time.time(),
    )
    if not shards:
        job.finished_at = job.created_at
    return job, shards


class BatchRunner:
    def __init__(self, store: Store, lease: LeaderLease, offsets_h: dict[str, float]) -> None:
        self._store = store
        self._lease = lease
        self._offsets = offsets_h
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._busy: dict[str, int] = {}
        self._http: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        try:
            while True:
                await asyncio.sleep(TICK_S)
                if not self._lease.is_leader:
                    for task in list(self._running.values()):  # deposed: stop at once
                        task.cancel()
                    continue
                try:
                    await self._tick()
                except RedisError as exc:
                    log.warning("batch dispatch paused: Redis unavailable (%s)", exc)
        finally:
            for task in self._running.values():
                task.cancel()
            await self._http.close()

    async def _tick(self) -> None:
        every = await self._store.batch_jobs()
        now = time.time()
        for job in every:  # expired: the job and everything it stored go
            ended = job.finished_at or (job.created_at if job.state == "CANCELLED" else 0.0)
            if job.state != "RUNNING" and ended and now - ended > RESULTS_TTL_S:
                await self._store.drop_batch(job.job_id)
        cancelled = {j.job_id for j in every if j.state == "CANCELLED"}
        for (job_id, _), task in list(self._running.items()):
            if job_id in cancelled:
                task.cancel()  # its lease lapses; nothing schedules it again
        jobs = [j for j in every if j.state == "RUNNING"]
        if not jobs:
            return
        sites = await self._site_loads()
        now = time.time()
        for job in sorted(jobs, key=lambda j: j.created_at):
            done = await self._store.batch_done_shards(job.job_id)
            if len(done) == job.shards:
                await self._finish(job)
                continue
            leases = await self._store.batch_leases(job.job_id)
            for index in range(job.shards):
                if index in done or (job.job_id, index) in self._running:
                    continue
                lease = leases.get(index)
                if lease is not None and lease.expiry > now:
                    continue  # another replica's run may still finish
                if lease is not None and lease.attempt >= MAX_ATTEMPTS:
                    await self._fail_shard(job, index)
                    continue
                site = pick_site(sites, job.model, self._busy, self._offsets, now)
                if site is None:
                    return
                new = ShardLease(
                    site.site_id,
                    now + SHARD_LEASE_S,
                    (lease.attempt + 1) if lease else 1,
                    self._lease.replica_id,
                )
                old = lease.format() if lease else ""
                if not await self._store.lease_batch_shard(job.job_id, index, old, new):
                    continue  # another replica took it
                self._busy[site.site_id] = self._busy.get(site.site_id, 0) + 1
                task = asyncio.create_task(self._run_shard(job, index, site, new))
                self._running[(job.job_id, index)] = task

    async def _fail_shard(self, job: pb.BatchJob, index: int) -> None:
        why = await self._store.batch_failure(job.job_id, index) or "its sites stopped answering"
        items = json.loads(await self._store.batch_shard(job.job_id, index))
        error = json.dumps({"error": f"the shard failed {MAX_ATTEMPTS} times: {why}"})
        if await self._store.put_batch_output(
            job.job_id, index, json.dumps([error] * len(items)).encode()
        ):
            log.warning(
                "batch %s shard %d failed %d times: %s", job.job_id, index, MAX_ATTEMPTS, why
            )

    async def _renew(
        self, job_id: str, index: int, held: list[ShardLease], run: asyncio.Task[None]
    ) -> None:
        """Extend the lease (`held[0]`) while the shard runs; stop the run if it is lost."""
        while True:
            lease = held[0]
            await asyncio.sleep(SHARD_LEASE_S / 3)
            renewed = replace(lease, expiry=time.time() + SHARD_LEASE_S)
            try:
                kept = self._lease.is_leader and await self._store.lease_batch_shard(
                    job_id, index, lease.format(), renewed
                )
            except RedisError:
                kept = lease.expiry > time.time() + SHARD_LEASE_S / 3  # try again soon
                if kept:
                    continue
            if not kept:
                log.warning("batch %s shard %d: lease lost, stopping its run", job_id, index)
                run.cancel()
                return
            held[0] = renewed

    async def _site_loads(self) -> list[SiteLoad]:
        sites = await self._store.sites()
        reports = await self._store.reports()
        out = []
        for s in sites:
            report = reports.get(s.site_id)
            util = max((d.utilization for d in report.devices), default=0.0) if report else 0.0
            loaded = (
                frozenset(m.name for m in report.models if m.tier == "loaded")
                if report
                else frozenset()
            )
            out.append(
                SiteLoad(s.site_id, s.region, s.http_address, s.up, s.draining, util, loaded)
            )
        return out

    async def _run_shard(
        self, job: pb.BatchJob, index: int, site: SiteLoad, lease: ShardLease
    ) -> None:
        assert self._http is not None
        run = asyncio.current_task()
        assert run is not None
        held = [lease]
        renewer = asyncio.create_task(self._renew(job.job_id, index, held, run))
        try:
            items = json.loads(await self._store.batch_shard(job.job_id, index))
            url = f"http://{site.http_address}/v2/models/{job.model}/infer"
            outputs = []
            for body in items:
                async with self._http.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as reply:
                    raw = await _read_at_most(reply.content, MAX_OUTPUT_BYTES + 1)
                    text = raw.decode(errors="replace")
                    if reply.status == 200 and len(raw) > MAX_OUTPUT_BYTES:
                        too_big = f"the result exceeds {MAX_OUTPUT_BYTES} bytes, the most kept"
                        outputs.append(json.dumps({"error": too_big}))
                    elif reply.status == 200:
                        outputs.append(text)
                    elif 400 <= reply.status < 500 and reply.status != 429:
                        outputs.append(json.dumps({"error": _error_text(text, reply.status)}))
                    else:  # the site cannot serve now: let the lease lapse, run elsewhere
                        raise RuntimeError(f"HTTP {reply.status} from {site.site_id}")
            if await self._store.put_batch_output(job.job_id, index, json.dumps(outputs).encode()):
                log.info("batch %s shard %d done at %s", job.job_id, index, site.site_id)
        except (aiohttp.ClientError, RuntimeError, TimeoutError, RedisError) as exc:
            renewer.cancel()
            reason = f"{site.site_id}: {exc or type(exc).__name__}"
            log.warning("batch %s shard %d failed at %s", job.job_id, index, reason)
            with contextlib.suppress(RedisError):  # record why, and give the lease up now
                await self._store.batch_failure(job.job_id, index, reason)
                await self._store.lease_batch_shard(
                    job.job_id, index, held[0].format(), replace(held[0], expiry=0.0)
                )
        finally:
            renewer.cancel()
            self._busy[site.site_id] -= 1
            self._running.pop((job.job_id, index), None)

    async def _finish(self, job: pb.BatchJob) -> None:
        current = await self._store.get_batch(job.job_id)
        if current is None or current.state != "RUNNING":
            return  # cancelled meanwhile
        outputs = await self._store.batch_outputs(job.job_id)
        job.state = "DONE"
        job.shards_done = job.shards
        job.finished_at = time.time()
        job.items_failed = sum(
            1 for raw in outputs.values() for doc in json.loads(raw) if _is_error(doc)
        )
        await self._store.update_batch(job)
        log.info("batch %s done: %d items, %d failed", job.job_id, job.items, job.items_failed)


async def _read_at_most(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body, or its first `limit` bytes when it is longer (never more in memory)."""
    chunks, size = [], 0
    while size < limit:
        chunk = await stream.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _error_text(text: str, status: int) -> str:
    try:
        return str(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        return f"HTTP {status}"


def _is_error(doc: str) -> bool:
    """Whether one output is the {"error": ...} of an item the site rejected."""
    try:
        parsed = json.loads(doc)
    except ValueError:
        return True
    return isinstance(parsed, dict) and set(parsed) == {"error"}
