"""What the control plane's usage costs, in hourly sums and as the raw minutes it
kept before, side by side in one run on one Redis.

    python bench/usage_query.py [--sites 100] [--hours 24] [--records 10] [--rounds 3]

`--sites` sites each send one minute of usage for every minute of `--hours`
hours, each minute with `--records` records (tenants x models). The same minutes
are written twice, on two databases of one Redis:

- `minutes`: the layout before hourly sums, one hash of every minute ever sent
  (and its index by time), each query reading every minute in its range;
- `hours`: the store as it is (store.py): each minute summed into its site's
  hour as it arrives, a query reading an hour's sum wherever the range holds the
  whole hour.

Printed, each the median of `--rounds`: a minute's write (microseconds, the
client's wall time, all minutes written in order), all the hours' usage by site and
by hour (milliseconds), a range cut mid-hour at both ends, and Redis's memory for
each database, the hours before and after their minutes are dropped (sealed),
as the leader does once they are older than `usage_minutes_kept_h`. Then a
30-day month of `--month-sites` sites, every hour sealed: the month by model
read from the sites' hourly sums and from the hours summed over the fleet, and by
site from the sites' hourly sums and from their days.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgeplex.control_plane import usage  # noqa: E402
from edgeplex.control_plane.dashboard import USAGE_HOURS, Dashboard  # noqa: E402
from edgeplex.control_plane.store import Store  # noqa: E402
from edgeplex.proto import edgeplex_control_pb2 as pb  # noqa: E402
from tests.services import RedisServer  # noqa: E402

DAY = 1_796_428_800  # a UTC midnight


class Minutes:
    """The layout before hourly sums: every minute in one hash, indexed by start."""

    def __init__(self, store: Store) -> None:
        self.redis = store.redis

    async def put(self, report: pb.UsageReport) -> None:
        member = f"{report.site_id}/{report.minute}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset("edgeplex:usage", member, report.SerializeToString())
            pipe.zadd("edgeplex:usage:minutes", {member: usage.start_of(report)})
            await pipe.execute()

    async def reports(self, from_time: float, to_time: float) -> list[pb.UsageReport]:
        members = await self.redis.zrangebyscore(
            "edgeplex:usage:minutes", from_time, f"({to_time}" if to_time else "+inf"
        )
        if not members:
            return []
        raw = await self.redis.hmget("edgeplex:usage", [m.decode() for m in members])
        return [pb.UsageReport.FromString(r) for r in raw if r is not None]


def minutes(sites: int, hours: int, records: int) -> list[pb.UsageReport]:
    """Every minute of every site, in time order."""
    out = []
    for n in range(hours * 60):
        for s in range(sites):
            report = pb.UsageReport(site_id=f"site-{s:04d}", minute=DAY // 60 + n, interval_s=60)
            for r in range(records):
                record = report.records.add(
                    tenant=f"tenant-{r % 5}", model=f"model-{r // 5}", version="1",
                    requests=1 + (n + s + r) % 40, bytes_in=4096, bytes_out=512,
                    compute_s=0.002, device_byte_seconds=6e9,
                )  # fmt: skip
                record.failures["REJECTED"] = (n + r) % 3
            out.append(report)
    return out


async def timed_ms(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def memory(store: Store) -> int:
    info = await store.redis.info("memory")
    return int(info["used_memory"])


async def run(args: argparse.Namespace, url: str) -> None:
    old_store, new_store = Store(url + "1"), Store(url + "2")
    old, new = Minutes(old_store), new_store.usage
    sent = minutes(args.sites, args.hours, args.records)
    writes: dict[str, float] = {}
    used: dict[str, int] = {}  # Redis's memory as each layout was written
    base = await memory(new_store)
    for name, put in (("minutes", old.put), ("hours", new.put)):
        started = time.perf_counter()
        for report in sent:
            await put(report)
        writes[name] = (time.perf_counter() - started) / len(sent) * 1e6
        used[name] = await memory(new_store)
    end = DAY + args.hours * 3600
    cut_from, cut_to = DAY + 1800, end - 1800
    queries = {
        "all hours, by site": (DAY, end, "site"),
        "all hours, by hour": (DAY, end, "hour"),
        "cut mid-hour, by model": (cut_from, cut_to, "model"),
    }
    reads: dict[str, dict[str, list[float]]] = {q: {"minutes": [], "hours": []} for q in queries}
    for _ in range(args.rounds):
        for query, (f, t, by) in queries.items():
            for name, source in (("minutes", old.reports), ("hours", new.reports)):

                async def answer(source=source, f=f, t=t, by=by) -> pb.UsageTable:  # type: ignore[no-untyped-def]
                    return usage.summarize(await source(f, t), "", f, t, by)

                reads[query][name].append(await timed_ms(answer))
                if name == "hours":  # the two answers agree
                    a = usage.summarize(await old.reports(f, t), "", f, t, by)
                    b = usage.summarize(await new.reports(f, t), "", f, t, by)
                    assert [(r.key, r.requests) for r in a.rows] == [
                        (r.key, r.requests) for r in b.rows
                    ], query
    dashboard = await dashboard_reads(new_store, args, end)
    minutes_bytes, hours_bytes = used["minutes"] - base, used["hours"] - used["minutes"]
    await new_store.usage.trim(end + 3600, 0, 400 * 86400)  # every hour sealed
    sealed_bytes = await memory(new_store) - used["minutes"]
    monthly = await month(new_store, args) if args.month_sites else None
    await old_store.close()
    await new_store.close()

    print(f"usage at the control plane: {args.sites} sites x {args.hours} h x 60 minutes "
          f"({len(sent):,} minutes), {args.records} records a minute; "
          f"median of {args.rounds} rounds")  # fmt: skip
    print(f"{'':28} {'minutes':>10} {'hours':>10} {'ratio':>7}")
    print(f"{'a minute written (us)':28} {writes['minutes']:>10.0f} {writes['hours']:>10.0f} "
          f"{writes['hours'] / writes['minutes']:>6.2f}x")  # fmt: skip
    for query, times in reads.items():
        m, h = statistics.median(times["minutes"]), statistics.median(times["hours"])
        print(f"{query + ' (ms)':28} {m:>10.1f} {h:>10.1f} {m / h:>6.1f}x")
    print(f"{'Redis memory (MiB)':28} {minutes_bytes / 2**20:>10.1f} {hours_bytes / 2**20:>10.1f}"
          f"   (hours sealed, minutes dropped: {sealed_bytes / 2**20:.1f} MiB)")  # fmt: skip
    whole_ms, cached_ms = dashboard
    print(f"the dashboard's {USAGE_HOURS} h by model after a minute arrives: read whole "
          f"{whole_ms:.1f} ms, from its per-hour cache (the minute's hour read again) "
          f"{cached_ms:.1f} ms ({whole_ms / cached_ms:.1f}x)")  # fmt: skip
    if monthly is not None:
        m = monthly
        print(f"a 30-day month, {args.month_sites} sites ({m['sums']:,.0f} hourly sums, all "
              f"sealed): by model from the sites' sums {m['model_sites']:.0f} ms, from the "
              f"fleet's {m['model_fleet']:.0f} ms ({m['model_sites'] / m['model_fleet']:.1f}x); "
              f"by site from the sites' hourly sums {m['site_hours']:.0f} ms, from their days "
              f"{m['site_days']:.0f} ms ({m['site_hours'] / m['site_days']:.1f}x)")  # fmt: skip
        print(f"the dashboard's 30 days (the 29 before its last day): by model "
              f"{m['dash_model']:.0f} ms read, {m['dash_model_cached']:.1f} ms from its cache; "
              f"by site {m['dash_site']:.0f} ms read, {m['dash_site_cached']:.1f} ms from its "
              "cache")  # fmt: skip
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"one local Redis (appendfsync always), one client")  # fmt: skip


async def dashboard_reads(store: Store, args: argparse.Namespace, end: int) -> tuple[float, float]:
    """The dashboard's window (the last USAGE_HOURS hours, by model) after a site
    sends a minute into its last hour: read whole, as before the per-hour cache, and
    through the cache, which reads that hour again alone (median ms of each)."""
    dashboard = Dashboard(store, None, "", lambda: None)  # type: ignore[arg-type]
    since = end - USAGE_HOURS * 3600
    await dashboard._usage_since(since, "model")  # the cache filled, as by a first page
    times: dict[str, list[float]] = {"whole": [], "cached": []}
    for round_ in range(args.rounds):
        late = minutes(1, 1, args.records)[0]
        late.minute = (end - 3600) // 60 + round_  # into the window's last hour
        await store.usage.put(late)

        async def whole() -> pb.UsageTable:
            return usage.summarize(await store.usage.reports(since, 0, True), "", since, 0, "model")

        async def cached() -> pb.UsageTable:
            return (await dashboard._usage_since(since, "model")).table()

        times["cached"].append(await timed_ms(cached))
        times["whole"].append(await timed_ms(whole))
        a, b = await whole(), await cached()
        assert [(r.key, r.requests) for r in a.rows] == [(r.key, r.requests) for r in b.rows]
    return statistics.median(times["whole"]), statistics.median(times["cached"])


async def month(store: Store, args: argparse.Namespace) -> dict[str, float]:
    """A month of hourly sums for `--month-sites` sites (one hour-long report each),
    every hour sealed and summed over the fleet, every site's day summed; the month
    by model read from the sites' hourly sums and from the fleet's, and by site from
    the sites' hourly sums and from their days (median ms of each), and how many
    hourly sums."""
    await store.redis.flushdb()
    start = DAY - 30 * 86400
    for hour in range(30 * 24):
        for s in range(args.month_sites):
            report = pb.UsageReport(site_id=f"site-{s:04d}", minute=start // 3600 + hour,
                                    interval_s=3600)  # fmt: skip
            for r in range(args.records):
                report.records.add(tenant=f"tenant-{r % 5}", model=f"model-{r // 5}",
                                   version="1", requests=1 + r, compute_s=0.1)  # fmt: skip
            await store.usage.put(report)
    while (await store.usage.trim(DAY + 3 * 86400, 3600, 400 * 86400))[0]:
        pass
    while await store.redis.zcard("edgeplex:usage:undayed"):
        await store.usage.trim(DAY + 3 * 86400, 3600, 400 * 86400)
    # (rows, read from): the sites' hourly sums, the fleet's, the sites' days
    ways = {
        "model_sites": ("model", False, False),
        "model_fleet": ("model", True, False),
        "site_hours": ("site", False, False),
        "site_days": ("site", False, True),
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    answers: dict[str, list[tuple[str, int]]] = {}
    for _ in range(args.rounds):
        for way, (by, fleet, days) in ways.items():

            async def answer(by: str = by, fleet: bool = fleet, days: bool = days) -> pb.UsageTable:
                reports = await store.usage.reports(start, DAY, fleet, days)
                return usage.summarize(reports, "", start, DAY, by)

            times[way].append(await timed_ms(answer))
            answers[way] = [(r.key, r.requests) for r in (await answer()).rows]
    assert answers["model_sites"] == answers["model_fleet"]
    assert answers["site_hours"] == answers["site_days"]
    # The dashboard's 30 days: the 29 before its last day, read first by a new
    # dashboard and then again with no minute come since (its cache).
    for by in ("model", "site"):
        for key in (f"dash_{by}", f"dash_{by}_cached"):
            times[key] = []
        for _ in range(args.rounds):
            dashboard = Dashboard(store, None, "", lambda: None)  # type: ignore[arg-type]

            async def window(by: str = by, dashboard: Dashboard = dashboard) -> list[pb.UsageRow]:
                return await dashboard._usage_before(DAY, 30, by)

            times[f"dash_{by}"].append(await timed_ms(window))
            times[f"dash_{by}_cached"].append(await timed_ms(window))
    return {way: statistics.median(t) for way, t in times.items()} | {
        "sums": 30 * 24 * args.month_sites
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--month-sites", type=int, default=100,
                        help="sites of the month's query, from sealed hours (0: none)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeplex-usage-bench-") as work:
        redis = RedisServer(Path(work))
        redis.start()
        try:
            asyncio.run(run(args, redis.url.rsplit("/", 1)[0] + "/"))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
