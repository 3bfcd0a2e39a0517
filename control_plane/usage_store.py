"""Usage in Redis: each site's minutes while they are kept, its hours summed and
sealed, the fleet's hours and the sites' days summed from them. The only module
that knows the usage keys (store.py holds the rest):

    edgeplex:usage:m:<hour>:<site>  hash  minute start -> UsageReport, while kept
    edgeplex:usage:h:<hour>:<site>  string  UsageHour: the site's usage in the hour,
                             summed (hour: its start, unix seconds), and whether sealed
    edgeplex:usage:hours     zset  "<hour>:<site>" -> hour (every hour kept)
    edgeplex:usage:open      zset  "<hour>:<site>" -> hour (hours whose minutes are kept)
    edgeplex:usage:v:<hour>  string  minutes stored in the hour (readers' caches)
    edgeplex:usage:sites:<hour>  set  the sites with usage in the hour
    edgeplex:usage:f:<hour>  string  UsageReport: the hour summed over every site, once
                             every site's hour is sealed
    edgeplex:usage:fleet     zset  "<hour>" -> hour (the hours summed so)
    edgeplex:usage:unsummed  zset  "<hour>" -> hour (hours with a site-hour sealed, not
                             yet summed over the fleet)
    edgeplex:usage:d:<day>:<site>  string  UsageReport: the site's UTC day summed, once
                             every hour of it is sealed
    edgeplex:usage:days      zset  "<day>:<site>" -> day (the site-days summed so)
    edgeplex:usage:dh:<day>  string  the site-hours the day's sums hold
    edgeplex:usage:undayed   zset  "<day>:<site>" -> day (site-days with an hour sealed,
                             not yet summed)
    edgeplex:usage:days:listed  string  set once the days of older hours were listed

A minute counts once: a copy sent again replaces it while the minutes are kept,
and is refused after. When Sentinels watch Redis, a write returns only once a
replica has it (`Store.replicated`).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from edgeplex.control_plane import usage
from edgeplex.control_plane.redis_client import P, as_bytes, chunks, names
from edgeplex.proto import edgeplex_control_pb2 as pb


class UsageStore:
    """The usage keys of the control plane's Redis (`Store.usage`)."""

    def __init__(self, redis: aioredis.Redis, replicated: Callable[[], Awaitable[None]]) -> None:
        """`replicated`: returns once replicas have every write made so far (or
        raises NotReplicated), for the writes that must survive a failover."""
        self._redis = redis
        self._replicated = replicated

    async def put(self, report: pb.UsageReport) -> bool:
        """A site's minute of usage records, added to the site's hour and kept under
        (site, hour, minute) while the hour's minutes are kept: stored again, it
        replaces itself. Once the hour is sealed (its minutes dropped, `trim`) a
        minute it holds is not added again. False when it was already counted so."""
        start, hour = usage.start_of(report), usage.hour_of(report)
        offset = start - hour  # what the hour's list of minutes holds
        member = f"{hour}:{report.site_id}"
        hour_key, minutes_key = P + "usage:h:" + member, P + "usage:m:" + member
        fleet_key = P + f"usage:f:{hour}"
        day_start = hour - hour % usage.DAY_S
        day_key = P + f"usage:d:{day_start}:{report.site_id}"
        async with self._redis.pipeline(transaction=True) as pipe:
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
        await self._replicated()
        return True

    async def versions(self, hours: list[int]) -> list[int]:
        """Each hour's count of minutes stored in it (0: none since this count began):
        a cache of what an hour holds is current while its count has not moved."""
        raws = await self._redis.mget([P + f"usage:v:{hour}" for hour in hours])
        return [int(raw) if raw is not None else 0 for raw in raws]

    async def reports(
        self, from_time: float, to_time: float, fleet: bool = False, days: bool = False
    ) -> list[pb.UsageReport]:
        """Every report of `parts`, in one list."""
        parts = self.parts(from_time, to_time, fleet, days)
        return [report async for part in parts for report in part]

    def parts_by(
        self, from_time: float, to_time: float, by: str
    ) -> AsyncIterator[list[pb.UsageReport]]:
        """`parts` for a table whose rows are `by` (usage.GROUPS): from the fleet's
        hours for rows not by site, from the sites' days for rows by site."""
        return self.parts(from_time, to_time, by != "site", by == "site")

    async def parts(
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
            listed = await self._redis.zrangebyscore(P + "usage:fleet", from_time, _below(end))
            hours = [int(h) for h in names(listed) if int(h) + usage.HOUR_S <= end]
            sums = [P + f"usage:f:{hour}" for hour in hours]
            covered = [(hour, hour + usage.HOUR_S) for hour in hours]
        elif days and end - from_time >= usage.DAY_S:  # else no whole day fits
            held, covered = await self._summed_days(from_time, end)
            sums = [P + "usage:d:" + member for member in sorted(held)]
        # Listed after the sums: a sum made meanwhile holds hours read from their
        # sites (their sums stay), never from both.
        whole: list[str] = []  # members of the site-hours wholly inside the range
        cut: list[str] = []  # and of those either end cuts
        for lo, hi in _gaps(from_time - from_time % usage.HOUR_S, end, covered):
            found = await self._redis.zrangebyscore(P + "usage:hours", lo, _below(hi))
            for member in names(found):
                hour = int(member.partition(":")[0])
                if from_time <= hour and hour + usage.HOUR_S <= end:
                    if not held or _day_of(member) not in held:
                        whole.append(member)
                else:
                    cut.append(member)
        minutes: list[pb.UsageReport] = []  # at most two hours of minutes a site
        for chunk in chunks(cut, 500):
            async with self._redis.pipeline(transaction=True) as pipe:
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
        for chunk in chunks(sums, 1000):
            raws = await self._redis.mget(chunk)
            yield [pb.UsageReport.FromString(raw) for raw in raws if raw is not None]
            # A site's day dropped meanwhile with its first hour (usage_kept_days): the
            # hours it held that are still kept, read one by one.
            for key, raw in zip(chunk, raws, strict=True):
                if raw is None and held:  # (held: the sums are sites' days)
                    day, _, site = key.removeprefix(P + "usage:d:").partition(":")
                    held_hours = [int(day) + h * usage.HOUR_S for h in range(24)]
                    whole += [f"{h}:{site}" for h in held_hours if h + usage.HOUR_S <= end]
        for chunk in chunks(whole, 1000):
            raws = await self._redis.mget([P + "usage:h:" + m for m in chunk])
            yield [pb.UsageHour.FromString(raw).sum for raw in raws if raw is not None]

    async def _summed_days(
        self, from_time: float, end: float
    ) -> tuple[set[str], list[tuple[int, int]]]:
        """The site-days summed wholly inside [from_time, end), and the days every
        site-hour of which they hold (the site-hours a day holds, `usage:dh:<day>`,
        against the site-hours listed in it), read as one snapshot."""
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(P + "usage:days")
                    listed = await pipe.zrangebyscore(P + "usage:days", from_time, _below(end))
                    held = {
                        d for d in names(listed) if int(d.partition(":")[0]) + usage.DAY_S <= end
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

    async def trim(self, now: float, minutes_kept_s: float, kept_s: float) -> tuple[int, int]:
        """Seal the hours that ended more than `minutes_kept_s` ago (drop their
        minutes; their sums stay), sum each hour whose every site is sealed over the
        fleet, and drop the hours that ended more than `kept_s` ago; at most 10,000
        site-hours of each a call. Returns (sealed, dropped)."""
        sealed = 0
        ended = now - minutes_kept_s - usage.HOUR_S
        for member in names(
            await self._redis.zrangebyscore(P + "usage:open", "-inf", ended, start=0, num=10_000)
        ):
            hour_key = P + "usage:h:" + member
            async with self._redis.pipeline(transaction=True) as pipe:
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
        for hour in map(int, names(await self._redis.zrange(P + "usage:unsummed", 0, 999))):
            await self._sum_fleet_hour(hour)
        days_summed = 0
        # A site's day is summed once it ended before minutes stopped being kept
        # (no minute can come to it unsealed) and every hour of it is sealed.
        for member in names(
            await self._redis.zrangebyscore(
                P + "usage:undayed", "-inf", ended - usage.DAY_S + usage.HOUR_S, start=0, num=1000
            )
        ):
            days_summed += await self._sum_site_day(member)
        old = names(
            await self._redis.zrangebyscore(
                P + "usage:hours", "-inf", now - kept_s - usage.HOUR_S, start=0, num=10_000
            )
        )
        for chunk in chunks(old, 1000):
            gone = sorted({m.partition(":")[0] for m in chunk})
            async with self._redis.pipeline(transaction=True) as pipe:
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
        old_days = names(
            await self._redis.zrangebyscore(
                P + "usage:days", "-inf", gone_before, start=0, num=10_000
            )
        )
        for chunk in chunks(old_days, 1000):
            gone_days = sorted({d.partition(":")[0] for d in chunk})
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(*(P + "usage:d:" + d for d in chunk))
                pipe.delete(*(P + "usage:dh:" + d for d in gone_days))
                pipe.zrem(P + "usage:days", *chunk)
                await pipe.execute()
        await self._redis.zremrangebyscore(P + "usage:undayed", "-inf", gone_before)
        if sealed or old or days_summed:
            await self._replicated()
        return sealed, len(old)

    async def _sum_fleet_hour(self, hour: int, tries: int = 5) -> bool:
        """The hour summed over every site once every site's hour in it is sealed
        (then it leaves `usage:unsummed`); False while one is not, or if sites kept
        arriving while it was summed: it is tried again at the next trim, and read
        from its sites meanwhile."""
        fleet_key, sites_key = P + f"usage:f:{hour}", P + f"usage:sites:{hour}"
        for _ in range(tries):
            async with self._redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(fleet_key, sites_key)  # a site's first minute: SADD
                    if await pipe.exists(fleet_key):
                        await pipe.reset()
                        await self._redis.zrem(P + "usage:unsummed", str(hour))
                        return True
                    if await pipe.zcount(P + "usage:open", hour, hour):
                        return False
                    sites = sorted(names(await pipe.smembers(sites_key)))
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
            async with self._redis.pipeline(transaction=True) as pipe:
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
        if await self._redis.exists(P + "usage:days:listed"):
            return 0
        listed, cursor = 0, 0
        while True:
            cursor, found = await self._redis.zscan(P + "usage:hours", cursor, count=5000)
            days = _site_days(names(m for m, _ in found))
            if days:
                await self._redis.zadd(P + "usage:undayed", days)
                listed += len(days)
            if cursor == 0:
                break
        await self._redis.set(P + "usage:days:listed", "1")
        return listed

    async def migrate(self) -> int:
        """Minutes an earlier control plane kept in one hash (`usage`, with its index
        `usage:minutes`), moved into their hours; returns how many were moved."""
        moved = 0
        while True:
            _, found = await self._redis.hscan(P + "usage", 0, count=500)
            assert isinstance(found, dict)  # field -> value (no_values not asked)
            if not found:
                await self._redis.delete(P + "usage:minutes")
                return moved
            for raw in found.values():
                await self.put(pb.UsageReport.FromString(as_bytes(raw)))
            names = list(found)
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hdel(P + "usage", *names)
                pipe.zrem(P + "usage:minutes", *names)
                await pipe.execute()
            moved += len(names)


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
