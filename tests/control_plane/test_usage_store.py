"""Usage at the control plane against a real Redis: minutes summed into each
site's hours as they arrive, a minute sent again counted once, any range answered
exactly as the raw minutes would answer it, hours sealed and dropped by age, and
minutes an earlier version kept moved into their hours."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from edgeplex.control_plane import usage
from edgeplex.control_plane.store import Store
from edgeplex.proto import edgeplex_control_pb2 as pb
from tests.services import RedisServer

pytestmark = pytest.mark.slow

DAY = 1_796_428_800  # a UTC midnight (2026-12-05)
HOUR = 3600


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


def minute(
    site: str, start: int, requests: int, tenant: str = "acme", **more: float
) -> pb.UsageReport:
    record = pb.UsageRecord(
        tenant=tenant, model="mlp", version="1", requests=requests,
        bytes_in=100 * requests, compute_s=0.25 * requests,
        device_byte_seconds=1e9 * requests, **more,  # type: ignore[arg-type]
    )  # fmt: skip
    record.failures["REJECTED"] = requests // 3
    return pb.UsageReport(site_id=site, minute=start // 60, interval_s=60, records=[record])


class Counted(dict[tuple[str, int], pb.UsageReport]):
    """The minutes a store counted, each as last sent: what every answer must sum."""

    async def put(self, store: Store, report: pb.UsageReport) -> None:
        if await store.usage.put(report):
            self[(report.site_id, usage.start_of(report))] = report


def rows(table: pb.UsageTable) -> dict[tuple[str, str], tuple[int, int, int, float]]:
    return {
        (r.tenant, r.key): (r.requests, r.failures, r.bytes_in, round(r.compute_s, 6))
        for r in table.rows
    }


def run(redis_url: str, scenario):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        store = Store(redis_url)
        try:
            await store.redis.flushdb()
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_any_range_answers_as_the_raw_minutes_would(redis_url: str) -> None:
    """Random minutes of three sites over five hours (some sent twice, with new
    counts), and random ranges cut anywhere: the rows from hourly sums and cut
    hours' minutes equal the rows summed from the minutes as last sent."""
    rng = random.Random(7)
    latest: dict[tuple[str, int], pb.UsageReport] = {}

    async def scenario(store: Store) -> None:
        for _ in range(400):
            site = rng.choice(["a1", "a2", "b1"])
            start = DAY + 60 * rng.randrange(5 * 60)
            report = minute(site, start, rng.randrange(1, 50), rng.choice(["acme", "zed"]))
            latest[(site, start)] = report
            await store.usage.put(report)
        for _ in range(40):
            from_time = DAY + rng.randrange(-600, 5 * HOUR)
            to_time = rng.choice([0, from_time + rng.randrange(1, 4 * HOUR)])
            by = rng.choice(list(usage.GROUPS))
            for tenant in ("", "acme"):
                got = usage.summarize(await store.usage.reports(from_time, to_time), tenant,
                                      from_time, to_time, by)  # fmt: skip
                want = usage.summarize(latest.values(), tenant, from_time, to_time, by)
                assert rows(got) == rows(want), (from_time - DAY, to_time and to_time - DAY, by)

    run(redis_url, scenario)


def test_a_minute_sent_again_replaces_itself_even_at_once(redis_url: str) -> None:
    async def scenario(store: Store) -> None:
        # Sixty minutes of one site's hour at once (each put watches the hour's sum),
        # then each sent again with another count, also at once.
        await asyncio.gather(*(store.usage.put(minute("a1", DAY + 60 * n, 1)) for n in range(60)))
        await asyncio.gather(*(store.usage.put(minute("a1", DAY + 60 * n, 2)) for n in range(60)))
        table = usage.summarize(await store.usage.reports(DAY, DAY + HOUR), "", DAY, 0, "site")
        assert rows(table) == {("acme", "a1"): (120, 0, 12_000, 30.0)}
        hour = pb.UsageHour.FromString(await store.redis.get(f"edgeplex:usage:h:{DAY}:a1"))
        assert sorted(hour.minutes) == [60 * n for n in range(60)]  # seconds into the hour

    run(redis_url, scenario)


def test_sealed_hours_keep_their_sums_and_count_a_late_minute_once(redis_url: str) -> None:
    async def scenario(store: Store) -> None:
        for n in range(3):
            await store.usage.put(minute("a1", DAY + 60 * n, 10))
        await store.usage.put(minute("a1", DAY + 2 * HOUR, 5))
        now = DAY + 3 * HOUR
        # Minutes kept for an hour: the first hour ended two hours ago, the third is
        # still going on.
        assert await store.usage.trim(now, HOUR, 30 * 86400) == (1, 0)
        assert not await store.redis.exists(f"edgeplex:usage:m:{DAY}:a1")
        assert await store.redis.exists(f"edgeplex:usage:m:{DAY + 2 * HOUR}:a1")
        whole = usage.summarize(await store.usage.reports(DAY, 0), "", DAY, 0, "hour")
        assert [r.requests for r in whole.rows] == [30, 5]
        # A range that cuts the sealed hour is refused, naming it; one that cuts a
        # kept hour is answered from its minutes.
        with pytest.raises(usage.UsageGone, match="2026-12-05T00:00Z"):
            await store.usage.reports(DAY + 60, 0)
        cut = await store.usage.reports(DAY + 2 * HOUR + 30, 0)
        assert usage.summarize(cut, "", DAY + 2 * HOUR + 30, 0, "model").rows == []
        # A minute that comes after its hour was sealed is added once; one the hour
        # holds already is not added again.
        assert await store.usage.put(minute("a1", DAY + 60 * 7, 4))
        assert not await store.usage.put(minute("a1", DAY + 60 * 7, 4))
        assert not await store.usage.put(minute("a1", DAY, 10))
        again = usage.summarize(await store.usage.reports(DAY, DAY + HOUR), "", DAY, 0, "model")
        assert [r.requests for r in again.rows] == [34]
        assert not await store.redis.exists(f"edgeplex:usage:m:{DAY}:a1")
        # Past keeping, hours go, sealed or not.
        assert await store.usage.trim(DAY + 10 * 86400, HOUR, 7 * 86400) == (1, 2)
        assert await store.usage.reports(0, 0) == []
        assert not [k async for k in store.redis.scan_iter("edgeplex:usage*")]

    run(redis_url, scenario)


def test_hours_summed_over_the_fleet_answer_as_their_sites_do(redis_url: str) -> None:
    """Once every site's hour is sealed, the hour is summed over the fleet; queries
    not by site read that sum. Minutes sent late (a known site's, a new site's
    first, one the hour holds already) keep both sums in step: every grouping, for
    random ranges on the hour, reads the same from the fleet's sums, from the
    sites' and from the minutes counted."""
    rng = random.Random(11)
    counted = Counted()

    async def scenario(store: Store) -> None:
        for _ in range(300):
            start = DAY + 60 * rng.randrange(6 * 60)
            site, tenant = rng.choice(["a1", "a2", "b1"]), rng.choice(["acme", "zed"])
            await counted.put(store, minute(site, start, rng.randrange(1, 50), tenant))
        # Minutes kept an hour: hours 0 to 3 ended over an hour before "now".
        sealed, _ = await store.usage.trim(DAY + 5 * HOUR, HOUR, 30 * 86400)
        assert sealed >= 10
        summed = await store.redis.zrange("edgeplex:usage:fleet", 0, -1)
        assert sorted(int(h) for h in summed) == [DAY + n * HOUR for n in range(4)]
        await counted.put(store, minute("a1", DAY + HOUR + 59 * 60, 7))  # late, a known site
        await counted.put(store, minute("c9", DAY + 2 * HOUR + 60, 5, "new"))  # a new site's first
        again = next(r for (s, t), r in counted.items() if t < DAY + HOUR)
        assert not await store.usage.put(minute(again.site_id, usage.start_of(again), 99))
        for _ in range(30):
            first = DAY + HOUR * rng.randrange(-1, 6)
            last = rng.choice([0, first + HOUR * rng.randrange(1, 7)])
            for by in usage.GROUPS:
                want = rows(usage.summarize(counted.values(), "", first, last, by))
                for fleet in (False, True) if by != "site" else (False,):
                    got = await store.usage.reports(first, last, fleet)
                    table = usage.summarize(got, "", first, last, by)
                    assert rows(table) == want, (first - DAY, last and last - DAY, by, fleet)
        # Past keeping, the fleet's sums go with the sites'.
        await store.usage.trim(DAY + 40 * 86400, HOUR, 30 * 86400)
        assert not [k async for k in store.redis.scan_iter("edgeplex:usage*")]

    run(redis_url, scenario)


def test_a_sites_days_summed_answer_as_its_hours_do(redis_url: str) -> None:
    """Once a site's UTC day is past keeping minutes and every hour of it is sealed,
    the day is summed; rows by site read that sum in place of its 24 hours. Minutes
    sent late (into a sealed hour, into an hour the site had none in, one the hour
    holds already) keep the day in step: for random ranges on the hour, rows by
    site read from the days, from the hours and from the minutes counted agree."""
    rng = random.Random(5)
    counted = Counted()

    async def check(store: Store) -> None:
        for _ in range(40):
            first = DAY + HOUR * rng.randrange(-2, 3 * 24)
            last = rng.choice([0, first + HOUR * rng.randrange(1, 60)])
            want = rows(usage.summarize(counted.values(), "", first, last, "site"))
            for days in (False, True):
                got = await store.usage.reports(first, last, days=days)
                assert rows(usage.summarize(got, "", first, last, "site")) == want, (
                    (first - DAY) / HOUR, last and (last - DAY) / HOUR, days,
                )  # fmt: skip

    async def scenario(store: Store) -> None:
        for _ in range(400):  # three days; site b1 has nothing in the first 5 hours
            start = DAY + 60 * rng.randrange(3 * 24 * 60)
            site = rng.choice(["a1", "a2"] if start < DAY + 5 * HOUR else ["a1", "a2", "b1"])
            await counted.put(
                store, minute(site, start, rng.randrange(1, 50), rng.choice(["x", "y"]))
            )
        # Minutes kept an hour: at 00:30 on the third day, the first day is summed,
        # the second not yet (its last hour ended half an hour before).
        await store.usage.trim(DAY + 2 * 86400 + HOUR // 2, HOUR, 30 * 86400)
        summed = await store.redis.zrange("edgeplex:usage:days", 0, -1)
        assert sorted(summed) == [f"{DAY}:{s}".encode() for s in ("a1", "a2", "b1")]
        await check(store)
        await counted.put(store, minute("a1", DAY + 3 * HOUR + 60, 7))  # late, into a sealed hour
        await counted.put(store, minute("b1", DAY + 2 * HOUR, 5, "new"))  # b1's first in that hour
        again = next(r for (s, t), r in counted.items() if t < DAY + 86400)
        assert not await store.usage.put(minute(again.site_id, usage.start_of(again), 99))
        day = pb.UsageReport.FromString(await store.redis.get(f"edgeplex:usage:d:{DAY}:b1"))
        assert "new" in {record.tenant for record in day.records}
        await check(store)
        # A new site's first minute, that late: its day is read by the hour beside
        # the others' days until the next trim sums it.
        await counted.put(store, minute("c9", DAY + 4 * HOUR, 3))
        assert not await store.redis.exists(f"edgeplex:usage:d:{DAY}:c9")
        await check(store)
        # Every day ended: all are summed, and past keeping they go with their hours.
        await store.usage.trim(DAY + 5 * 86400, HOUR, 30 * 86400)
        assert await store.redis.zcard("edgeplex:usage:days") == 10
        await check(store)
        # A day dropped between its listing and its reading (as the first hour of
        # the oldest day goes): the hours it held that are kept are read instead.
        listed = store.usage._summed_days

        async def dropped_meanwhile(from_time: float, end: float):  # type: ignore[no-untyped-def]
            held, covered = await listed(from_time, end)
            await store.redis.delete(f"edgeplex:usage:d:{DAY + 86400}:a2")
            return held, covered

        store.usage._summed_days = dropped_meanwhile  # type: ignore[method-assign]
        first = DAY + 86400
        got = await store.usage.reports(first, first + 86400, days=True)
        want = usage.summarize(counted.values(), "", first, first + 86400, "site")
        assert rows(usage.summarize(got, "", first, first + 86400, "site")) == rows(want)
        store.usage._summed_days = listed  # type: ignore[method-assign]
        await store.usage.trim(DAY + 40 * 86400, HOUR, 30 * 86400)
        assert not [k async for k in store.redis.scan_iter("edgeplex:usage*")]

    run(redis_url, scenario)


def test_days_an_older_control_plane_sealed_are_summed_after_an_upgrade(redis_url: str) -> None:
    """Hours sealed before days were summed (no day listed for them): the first
    start lists their days once, and the trims that follow sum them."""

    async def scenario(store: Store) -> None:
        reports = [minute(s, DAY + 600 * n, n + 1) for s in ("a1", "b1") for n in range(300)]
        for report in reports:
            await store.usage.put(report)
        await store.usage.trim(DAY + 4 * 86400, HOUR, 30 * 86400)
        for key in ("usage:days", "usage:undayed"):  # as an older control plane left it
            await store.redis.delete(f"edgeplex:{key}")
        for key in [k async for k in store.redis.scan_iter("edgeplex:usage:d*")]:
            await store.redis.delete(key)
        assert await store.usage.list_days_to_sum() == 6  # 300 x 10 minutes: 3 days, 2 sites
        assert await store.usage.list_days_to_sum() == 0  # once
        await store.usage.trim(DAY + 4 * 86400, HOUR, 30 * 86400)
        assert await store.redis.zcard("edgeplex:usage:days") == 6
        got = await store.usage.reports(DAY, DAY + 3 * 86400, days=True)
        want = usage.summarize(reports, "", DAY, 0, "site")
        assert rows(usage.summarize(got, "", DAY, 0, "site")) == rows(want)

    run(redis_url, scenario)


def test_an_hour_not_summed_at_its_sealing_is_summed_at_a_later_trim(redis_url: str) -> None:
    """Summing can lose to sites arriving in the hour (it gives up after a few
    tries): the hour stays listed as unsummed, is read from its sites meanwhile,
    and is summed at the next trim."""

    async def scenario(store: Store) -> None:
        for site in ("a1", "b1"):
            await store.usage.put(minute(site, DAY + 60, 4))
        real = store.usage._sum_fleet_hour

        async def lost(hour: int, tries: int = 5) -> bool:
            return False

        store.usage._sum_fleet_hour = lost  # type: ignore[method-assign]
        assert await store.usage.trim(DAY + 3 * HOUR, HOUR, 30 * 86400) == (2, 0)
        assert await store.redis.zrange("edgeplex:usage:unsummed", 0, -1) == [str(DAY).encode()]
        rows = usage.summarize(await store.usage.reports(DAY, 0, True), "", DAY, 0, "model")
        assert [r.requests for r in rows.rows] == [8]
        store.usage._sum_fleet_hour = real  # type: ignore[method-assign]
        assert await store.usage.trim(DAY + 3 * HOUR, HOUR, 30 * 86400) == (0, 0)
        assert await store.redis.zrange("edgeplex:usage:fleet", 0, -1) == [str(DAY).encode()]
        assert not await store.redis.exists("edgeplex:usage:unsummed")
        fleet = pb.UsageReport.FromString(await store.redis.get(f"edgeplex:usage:f:{DAY}"))
        assert [(r.tenant, r.requests) for r in fleet.records] == [("acme", 8)]

    run(redis_url, scenario)


def test_minutes_an_earlier_version_kept_move_into_their_hours(redis_url: str) -> None:
    async def scenario(store: Store) -> None:
        old = [minute(s, DAY + 60 * n, n + 1) for s in ("a1", "b1") for n in range(0, 120, 7)]
        for report in old:  # the layout before hourly sums
            member = f"{report.site_id}/{report.minute}"
            await store.redis.hset("edgeplex:usage", member, report.SerializeToString())
            await store.redis.zadd("edgeplex:usage:minutes", {member: usage.start_of(report)})
        assert await store.usage.migrate() == len(old)
        assert not await store.redis.exists("edgeplex:usage", "edgeplex:usage:minutes")
        got = usage.summarize(await store.usage.reports(0, 0), "", 0, 0, "site")
        assert rows(got) == rows(usage.summarize(old, "", 0, 0, "site"))
        assert await store.usage.migrate() == 0

    run(redis_url, scenario)


def test_hour_sums_add_every_field() -> None:
    a = minute("a1", DAY, 3, cold_starts=1)
    b = minute("a1", DAY + 60, 6, tenant="zed")
    c = minute("a1", DAY + 120, 9, bytes_out=5)
    total = usage.hour_sum("a1", DAY, [a, b, c])
    assert (total.minute, total.interval_s, usage.start_of(total)) == (DAY // HOUR, HOUR, DAY)
    acme, zed = sorted(total.records, key=lambda r: r.tenant)
    assert (acme.requests, acme.cold_starts, acme.bytes_out, acme.failures["REJECTED"]) == (
        12, 1, 5, 4,
    )  # fmt: skip
    assert (zed.requests, zed.bytes_in, zed.compute_s, zed.device_byte_seconds) == (
        6, 600, 1.5, 6e9,
    )  # fmt: skip


def test_rows_by_hour_day_and_month_are_utc_and_the_cli_offers_every_grouping() -> None:
    from edgeplex.control_plane.cli_usage import GROUPS

    month_end = 1_798_761_540  # 2026-12-31T23:59:00Z
    reports = [minute("a1", month_end, 2), minute("a1", month_end + 60, 3)]
    keys = {
        by: [(r.key, r.requests) for r in usage.summarize(reports, "", 0, 0, by).rows]
        for by in ("hour", "day", "month")
    }
    assert keys == {
        "hour": [("2026-12-31T23:00Z", 2), ("2027-01-01T00:00Z", 3)],
        "day": [("2026-12-31", 2), ("2027-01-01", 3)],
        "month": [("2026-12", 2), ("2027-01", 3)],
    }
    assert tuple(usage.GROUPS) == GROUPS


def test_the_dashboard_reads_again_only_the_hours_a_minute_has_reached(redis_url: str) -> None:
    """The dashboard's 24 hours are kept per hour with the hour's count of minutes
    stored: a read after no change reads no hour, a minute sent late (or sent again)
    has only its own hour read again, and the rows always equal the minutes' own."""
    from edgeplex.control_plane.dashboard import Dashboard

    latest: dict[tuple[str, int], pb.UsageReport] = {}
    read: list[int] = []

    async def scenario(store: Store) -> None:
        parts = store.usage.parts

        def counted(from_time: float, to_time: float, fleet: bool = False, days: bool = False):  # type: ignore[no-untyped-def]
            read.append(int(from_time))
            return parts(from_time, to_time, fleet, days)

        store.usage.parts = counted  # type: ignore[method-assign]
        dashboard = Dashboard(store, None, "token", lambda: None)  # type: ignore[arg-type]

        async def put(report: pb.UsageReport) -> None:
            latest[(report.site_id, report.minute)] = report
            await store.usage.put(report)

        async def check(by: str) -> None:
            got = (await dashboard._usage_since(DAY, by)).table()
            assert rows(got) == rows(usage.summarize(latest.values(), "", DAY, 0, by)), by

        for i, site in enumerate(["a1", "b1", "a1", "b1"]):
            await put(minute(site, DAY + i * HOUR + 60 * i, 10 + i, tenant=f"t{i % 2}"))
        for by in ("model", "site", "hour"):
            await check(by)
        assert len(read) == 3 * 24  # each hour once, for each grouping
        read.clear()
        await check("model")
        assert read == []  # nothing new: every hour from the cache
        await put(minute("a1", DAY + HOUR + 300, 7))  # late, into an hour already read
        await put(minute("b1", DAY + 3 * HOUR + 180, 99, tenant="t1"))  # sent again
        await check("model")
        assert sorted(read) == [DAY + HOUR, DAY + 3 * HOUR]
        await dashboard._usage_since(DAY + 2 * HOUR, "model")
        assert min(hour for _, hour in dashboard._hours) >= DAY + 2 * HOUR  # left the window

    run(redis_url, scenario)


def test_the_dashboards_longer_windows_read_the_longer_sums_once(redis_url: str) -> None:
    """A 7- or 30-day window's hours before its last day are one query of the fleet's
    hours (rows not by site) or the sites' days (by site), read again only when a
    minute reached one of them; the rows equal the minutes' own."""
    from edgeplex.control_plane.dashboard import USAGE_HOURS, Dashboard

    rng = random.Random(11)
    end = DAY + 30 * 86400  # the last day's first hour
    counted = Counted()
    read: list[tuple[int, bool, bool]] = []

    async def scenario(store: Store) -> None:
        parts = store.usage.parts

        def reading(from_time: float, to_time: float, fleet: bool = False, days: bool = False):  # type: ignore[no-untyped-def]
            read.append((int(from_time), fleet, days))
            return parts(from_time, to_time, fleet, days)

        store.usage.parts = reading  # type: ignore[method-assign]
        dashboard = Dashboard(store, None, "token", lambda: None)  # type: ignore[arg-type]
        for _ in range(300):  # over 31 days, some before the window
            start = end - 31 * 86400 + 60 * rng.randrange(31 * 24 * 60)
            site, tenant = rng.choice(["a1", "b1"]), rng.choice(["acme", "zed"])
            await counted.put(store, minute(site, start, rng.randrange(1, 50), tenant))
        for _ in range(3):  # hours sealed, the fleet's hours and the sites' days summed
            await store.usage.trim(end + 3 * 86400, HOUR, 90 * 86400)

        async def check(days: int, by: str) -> None:
            start = end - (days * 24 - USAGE_HOURS) * HOUR
            got = pb.UsageTable(rows=await dashboard._usage_before(end, days, by))
            want = usage.summarize(counted.values(), "", start, end, by)
            assert rows(got) == rows(want), (days, by)

        for by in ("model", "site", "hour", "day"):
            await check(30, by)
        start = end - 29 * 86400
        assert sorted(read) == [(start, False, True)] + [(start, True, False)] * 3
        read.clear()
        await check(30, "site")
        await check(30, "model")
        assert read == []  # nothing new: from the cache
        late = minute("b1", end - 20 * 86400 + 7 * HOUR + 120, 40, "acme")
        assert (late.site_id, usage.start_of(late)) not in counted
        await counted.put(store, late)  # into a sealed hour of a summed day
        await check(30, "site")
        await check(7, "model")
        assert sorted(read) == [(start, False, True), (end - 6 * 86400, True, False)]

    run(redis_url, scenario)
