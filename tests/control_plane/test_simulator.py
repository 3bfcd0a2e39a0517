"""The fleet simulator and the forecaster: deterministic for a seed, trace files
in every layout it reads, and a forecaster that sees a region's rise before the EWMA."""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeplex.agent.fleet.routing import Local, PeerOption, Where, choose_route
from edgeplex.control_plane.demand import ewma
from edgeplex.control_plane.forecast import Forecaster
from edgeplex.control_plane.sim.engine import Outcome, SimConfig, _Fleet, simulate
from edgeplex.control_plane.sim.serving import forward_choice, serve_step
from edgeplex.control_plane.sim.spec import (
    Catalog,
    FleetSpec,
    GiB,
    RegionSpec,
    SiteGroup,
    StandardKnobs,
    standard_catalog,
    write_catalog,
)
from edgeplex.control_plane.sim.study import Study, peak_onset_misses, peak_onset_placed_late
from edgeplex.control_plane.sim.traces import (
    SyntheticTrace,
    TraceFile,
    TraceKnobs,
    read_azure_functions,
    read_rows,
    write_csv,
)

DAY = 1440


def small_fleet(sites_per_region: int = 2, gpu: int = 8 * GiB) -> FleetSpec:
    return FleetSpec(
        regions=[
            RegionSpec(name="east", utc_offset_h=0),
            RegionSpec(name="west", utc_offset_h=8),
            RegionSpec(name="south", utc_offset_h=16),
        ],
        rtt_ms={"east,west": 60, "east,south": 120, "west,south": 180},
        sites=[
            SiteGroup(region=r, count=sites_per_region, gpu_memory=gpu, concurrency=16)
            for r in ("east", "west", "south")
        ],
    )


KNOBS = StandardKnobs(models=120, size_min_bytes=50 * 10**6, size_max_bytes=1500 * 10**6)


def test_the_simulator_is_deterministic_for_a_seed() -> None:
    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=3)

    def run(seed: int) -> dict[str, float | int]:
        trace = SyntheticTrace(fleet, catalog, 0.25, TraceKnobs(peak_rps=2000), seed)
        config = SimConfig(step_min=5)
        return simulate(fleet, catalog, trace, trace.minutes, "reactive", config).summary(120)

    first = run(7)
    assert run(7) == first
    assert run(8) != first
    assert 0.0 < first["served_in_region_within_slo"] <= 1.0


def test_trace_files_replay_the_generated_trace(tmp_path: Path) -> None:
    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=1)
    trace = SyntheticTrace(fleet, catalog, 0.05, TraceKnobs(peak_rps=500), seed=2)
    regions = [r.name for r in fleet.regions]
    rows = [(t, regions[r], catalog.names[m], n) for t, r, m, n in trace.rows()]
    write_csv(tmp_path / "trace.csv", rows)
    replay = TraceFile(read_rows(tmp_path / "trace.csv"), fleet, catalog)
    for minute in (0, 17, trace.minutes - 1):
        assert np.array_equal(replay.demand(minute, 1), trace.demand(minute, 1))
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(zip(*rows, strict=True))
    table = pa.table({k: list(v) for k, v in zip(("minute", "region", "model", "requests"),
                                                  columns, strict=True)})  # fmt: skip
    pq.write_table(table, tmp_path / "trace.parquet")
    parquet = TraceFile(read_rows(tmp_path / "trace.parquet"), fleet, catalog)
    assert np.array_equal(parquet.demand(0, trace.minutes), replay.demand(0, trace.minutes))
    with pytest.raises(ValueError, match="'nowhere' is not in the fleet"):
        TraceFile([(0, "nowhere", catalog.names[0], 1)], fleet, catalog)


def test_azure_functions_layout(tmp_path: Path) -> None:
    """The public traces' per-minute invocation counts, one file per day."""
    header = ["HashOwner", "HashApp", "HashFunction", "Trigger", *map(str, range(1, 1441))]
    functions = [("o1", "a1", "f" * 64, "http"), ("o1", "a1", "e" * 64, "timer"),
                 ("o2", "a2", "d" * 64, "queue")]  # fmt: skip
    for day in (1, 2):
        with (tmp_path / f"invocations_per_function_md.anon.d0{day}.csv").open("w") as f:
            out = csv.writer(f)
            out.writerow(header)
            for i, fn in enumerate(functions):
                counts = [0] * 1440
                counts[i] = 10 * day + i  # minute i + 1
                out.writerow([*fn, *counts])
    paths = sorted(tmp_path.glob("*.csv"))
    rows = list(read_azure_functions(paths, ["east", "west"]))
    assert len(rows) == 6
    assert (0, rows[0][1], "fn-ffffffffffff", 10.0) == rows[0]
    assert rows[3][0] == DAY and rows[3][3] == 20.0  # day two, minute one
    owners = {r[2]: r[1] for r in rows}
    assert owners["fn-ffffffffffff"] == owners["fn-eeeeeeeeeeee"]  # one owner, one region


def test_the_forecaster_sees_the_rise_before_the_ewma() -> None:
    """On a diurnal series, an hour before the daily rise the forecast is already
    up, while the reactive EWMA still reads the night."""
    forecaster, seen, seen_at = Forecaster(), {}, 0.0
    start = 4 * 86400.0  # a Monday
    key = ("east", "m")

    def rate(t: float) -> float:
        hour = (t / 3600) % 24
        return 100.0 if 9 <= hour < 17 else 5.0

    for step in range(2 * 24 * 12 + 8 * 12 + 7):  # two days and 8.5 hours, 5-minute steps
        t = start + step * 300
        observed = {key: rate(t)}
        forecaster.observe(observed, t)
        seen = ewma(seen, observed, t - seen_at, 60.0)
        seen_at = t
    assert 8 <= ((seen_at - start) / 3600) % 24 < 9
    assert seen[key] < 10
    assert forecaster.predict(seen_at, 3600)[key] > 50
    # Its state survives a leader change (Redis holds it as bytes, no pickle).
    again = Forecaster.from_bytes(forecaster.to_bytes())
    assert again.predict(seen_at, 3600) == pytest.approx(forecaster.predict(seen_at, 3600))


def test_the_forecasters_state_is_compact_and_reads_the_old_layout() -> None:
    """Saved as float32 rates and bit masks (under 1 KB a key, where the float64
    layout took 3 KB); state an earlier release saved in that layout still reads."""
    forecaster = Forecaster()
    rng = np.random.default_rng(1)
    keys = [(r, f"m{i}") for r in ("east", "west") for i in range(300)]
    for step in range(30 * 12):  # 30 hours of 5-minute rounds
        rates = rng.gamma(1.0, 5.0, len(keys))
        forecaster.observe(dict(zip(keys, rates.tolist(), strict=True)), 4 * 86400.0 + step * 300)
    now = 4 * 86400.0 + 30 * 3600
    state = forecaster.to_bytes()
    assert len(state) < 1000 * len(keys)
    again = Forecaster.from_bytes(state)
    assert again.predict(now, 3600) == pytest.approx(forecaster.predict(now, 3600), rel=1e-6)
    assert (again.seen_week_hour == forecaster.seen_week_hour).all()

    meta = json.dumps(
        {
            "keys": [list(k) for k in keys],
            "last": forecaster._last,
            "bucket": forecaster._bucket,
            "bucket_n": forecaster._bucket_n,
        }
    ).encode()
    arrays = [forecaster.recent, forecaster.by_hour, forecaster.by_week_hour,
              forecaster.seen_hour, forecaster.seen_week_hour, forecaster._bucket_sum]  # fmt: skip
    old = (
        struct.pack("<I", len(meta))
        + meta
        + b"".join(np.asarray(a, dtype="<f8").tobytes() for a in arrays)
    )
    assert len(old) > 3000 * len(keys)
    # The old layout kept no level for today: it starts from the last observation's
    # ratio to the season, and keeps everything else.
    migrated = Forecaster.from_bytes(old)
    for name in ("recent", "by_hour", "by_week_hour", "seen_hour", "seen_week_hour"):
        assert (getattr(migrated, name) == getattr(forecaster, name)).all(), name
    assert (migrated.level_seen == forecaster.recent).all()
    assert migrated.predict(now, 3600).keys() <= forecaster.predict(now, 3600).keys() | {
        k for k, v in zip(keys, forecaster.recent, strict=True) if v >= 1e-3
    }
    with pytest.raises(ValueError, match="wrong size"):
        Forecaster.from_bytes(state[:-1])


def test_a_forecaster_saved_before_any_demand_reads_back() -> None:
    """A fleet's first round saves a forecaster that has seen nothing; the next
    leader reads it back (it once found it unreadable and started afresh)."""
    empty = Forecaster.from_bytes(Forecaster().to_bytes())
    assert empty.keys == [] and empty.predict(4 * 86400.0, 3600) == {}


def test_the_forecast_follows_todays_level_and_bursts_not_one_periods_noise() -> None:
    """A key whose day runs at twice its usual level is forecast at twice the
    season, from the last hour, not from one noisy observation; a burst the
    season does not foretell is forecast at its recent level."""
    forecaster = Forecaster(recent_half_life_s=60.0)
    start = 4 * 86400.0  # a Monday
    steady, doubled, noisy, burst = (("east", m) for m in ("steady", "doubled", "noisy", "burst"))
    rng = np.random.default_rng(0)
    day = 24 * 12  # 5-minute rounds
    for step in range(2 * day + day // 2):  # two days at 10 req/s each, then half of one
        t = start + step * 300
        today = step >= 2 * day
        forecaster.observe(
            {
                steady: 10.0,
                doubled: 20.0 if today else 10.0,
                noisy: 10.0 * float(rng.lognormal(0.0, 0.5)),
                burst: 100.0 if today and step % day >= day // 2 - 6 else 10.0,
            },
            t,
        )
    forecast = forecaster.predict(t, 3600)
    assert forecast[steady] == pytest.approx(10.0, rel=0.01)
    assert forecast[doubled] == pytest.approx(20.0, rel=0.05)
    assert forecast[burst] == pytest.approx(100.0, rel=0.05)
    # The noisy key's observations swing by half; its forecast by far less.
    assert 0.7 < forecast[noisy] / 10.0 < 1.4, forecast[noisy]


def test_forecasting_cuts_misses_at_peak_onset() -> None:
    """A diurnal trace whose models go quiet at night, on a fleet with room for the
    catalog: reactive placement drops what the night left without demand, so as
    each region wakes its requests find no holder in the region (the agents
    forward them to a region still holding the model) until placement catches
    up; forecasting, having seen the day before, has it there. Three days, the
    first to learn."""
    fleet, catalog = small_fleet(gpu=24 * GiB), standard_catalog(KNOBS, seed=3)
    knobs = TraceKnobs(peak_rps=2000, night_floor=0.0, model_phase_h=0.0, bursts_per_day=0,
                       launch_share=0.0, retire_share=0.0)  # fmt: skip
    trace = SyntheticTrace(fleet, catalog, 3, knobs, seed=5)
    onset, late = {}, {}
    for strategy in ("reactive", "forecast"):
        outcome = simulate(fleet, catalog, trace, trace.minutes, strategy, SimConfig(step_min=5))
        onset[strategy] = peak_onset_misses(outcome, 5)
        late[strategy] = peak_onset_placed_late(outcome, 5)
        assert outcome.summary(len(catalog))["served_in_region_within_slo"] > 0.99
    assert onset["reactive"] > 1_000
    assert onset["forecast"] <= 0.5 * onset["reactive"], onset
    # The room holds the catalog, so reactive's misses there are its lag: for
    # models it placed in the region within the hour after (engine._Lag).
    assert late["reactive"] >= 0.9 * onset["reactive"], (late, onset)
    assert late["forecast"] <= 0.5 * late["reactive"], late


def test_history_teaches_the_forecaster_and_is_not_counted() -> None:
    """The trace before `start_min` only teaches the forecaster (no fleet runs it),
    as one kept in Redis has learned from the weeks before: on the first day
    counted, forecasting's misses at peak onset are already cut. Counting starts
    after the history and the warm-up."""
    fleet, catalog = small_fleet(gpu=24 * GiB), standard_catalog(KNOBS, seed=3)
    knobs = TraceKnobs(peak_rps=2000, night_floor=0.0, model_phase_h=0.0, bursts_per_day=0,
                       launch_share=0.0, retire_share=0.0)  # fmt: skip
    trace = SyntheticTrace(fleet, catalog, 2, knobs, seed=5)
    config = SimConfig(step_min=5)
    onset = {}
    for strategy in ("reactive", "forecast"):
        outcome = simulate(fleet, catalog, trace, 2 * DAY, strategy, config, start_min=DAY)
        assert outcome.timeline.start_min == DAY + config.warmup_min
        assert outcome.hours == (DAY - config.warmup_min) / 60
        onset[strategy] = peak_onset_misses(outcome, 5)
    assert onset["reactive"] > 1_000
    assert onset["forecast"] <= 0.5 * onset["reactive"], onset


def test_simulate_cli_writes_the_report(tmp_path: Path) -> None:
    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=2)
    (tmp_path / "fleet.yaml").write_text(json.dumps(fleet.model_dump()))
    write_catalog(catalog, tmp_path / "catalog.yaml")
    trace = SyntheticTrace(fleet, catalog, 0.2, TraceKnobs(peak_rps=800), seed=4)
    regions = [r.name for r in fleet.regions]
    write_csv(tmp_path / "trace.csv",
              ((t, regions[r], catalog.names[m], n) for t, r, m, n in trace.rows()))  # fmt: skip
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "edgeplex", "simulate", "--fleet", str(tmp_path / "fleet.yaml"),
         "--catalog", str(tmp_path / "catalog.yaml"), "--trace", str(tmp_path / "trace.csv"),
         "--out", str(out), "--step-min", "5", "--search-days", "0.2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    for strategy in ("dedicated", "lru", "static", "reactive", "forecast"):
        for key in ("gpus", "served_in_region_within_slo", "forwarded", "cold_starts",
                    "churn_per_hour", "cold_starts_peak_onset", "bytes_moved"):  # fmt: skip
            assert key in report[strategy], (strategy, key)
    assert report["dedicated"]["gpus"] >= report["forecast"]["gpus"]
    for strategy in ("lru", "static", "reactive", "forecast"):  # the sizes, to run again
        per_region = report[strategy]["per_region"]
        assert list(per_region) == ["east", "west", "south"]
        assert sum(per_region.values()) == report[strategy]["gpus"], strategy
    # No strategy beats the lower bound; the static packing never moves.
    floor = report["lower_bound"]["gpus"]
    assert 0 < floor <= min(report[k]["gpus"] or 10**6 for k in ("lru", "static", "forecast"))
    assert report["static"]["churn_per_hour"] == 0 and report["static"]["cold_starts"] == 0
    assert {g["goal"] for g in report["goals"]} >= {
        "GPUs against the lower bound (no placement needs fewer)",
        "GPUs saved against the better of per-site LRU and static",
    }
    page = (out / "report.html").read_text()
    for png in ("demand.png", "gpus.png", "residency.png", "cold_starts.png", "forwarded.png"):
        assert (out / png).stat().st_size > 1000 and png in page


def test_the_study_reports_the_same_side_by_side_as_one_run_at_a_time() -> None:
    """Sized in forked workers (results back as JSON and NumPy files), the report
    and the timelines it plots are those of one run after another."""
    from edgeplex.control_plane.sim.study import run_study

    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=2)
    trace = SyntheticTrace(fleet, catalog, 0.2, TraceKnobs(peak_rps=800), seed=4)
    reports = []
    for jobs in (1, 3):
        study = Study(fleet, catalog, trace, trace.minutes, SimConfig(step_min=5), 0.9, 0.2, 15,
                      log=lambda _line: None, jobs=jobs)  # fmt: skip
        report = run_study(study)
        del report["runtime_s"], report["lower_bound"]["runtime_s"]  # type: ignore[attr-defined]
        timelines = report.pop("_timelines")
        plotted = {
            name: [np.asarray(getattr(outcome.timeline, field)).tolist()
                   for field in ("demand_rps", "gpus_in_use", "holders", "cold_by_region")]
            for name, outcome in timelines.items()  # type: ignore[attr-defined]
        }  # fmt: skip
        reports.append((json.dumps(report, sort_keys=True, default=float), plotted))
    assert reports[0][0] == reports[1][0]
    assert reports[0][1] == reports[1][1]
    assert json.loads(reports[0][0])["forecast"]["gpus"] > 0


def test_a_run_that_fails_in_its_worker_is_named_and_stops_the_study() -> None:
    from edgeplex.control_plane.sim.workers import run_side_by_side

    def fails() -> dict[str, object]:
        raise ValueError("no such region")

    with pytest.raises(RuntimeError, match="run 'bad' failed"):
        run_side_by_side({"bad": fails, "slow": lambda: {"x": 1}}, 2)
    assert run_side_by_side({"a": lambda: {"x": [1, 2]}}, 2) == {"a": {"x": [1, 2]}}


def test_study_sizes_within_the_search_bounds() -> None:
    fleet, catalog = small_fleet(sites_per_region=4), standard_catalog(KNOBS, seed=9)
    trace = SyntheticTrace(fleet, catalog, 0.2, TraceKnobs(peak_rps=1500), seed=9)
    study = Study(fleet, catalog, trace, trace.minutes, SimConfig(step_min=5), 0.9, 0.2, 5,
                  log=lambda _line: None)  # fmt: skip
    from edgeplex.control_plane.sim.study import served, size_strategy

    sized = size_strategy(study, "lru")
    assert sized.gpus is not None and 3 <= sized.gpus <= 4 * fleet.gpus
    assert served(sized.outcome) >= 0.85  # the search is coarser than the final run


def test_refined_sizes_are_the_smallest_at_the_reported_resolution() -> None:
    """A size found at coarse steps is refined at the final run's: the fleet
    reported meets the target in its own run, and no region can lose a site."""
    from edgeplex.control_plane.sim.study import served, size_strategy

    fleet, catalog = small_fleet(sites_per_region=4), standard_catalog(KNOBS, seed=9)
    trace = SyntheticTrace(fleet, catalog, 0.2, TraceKnobs(peak_rps=1500), seed=9)
    config = SimConfig(step_min=5)
    study = Study(fleet, catalog, trace, trace.minutes, config, 0.9, 0.2, 15,
                  log=lambda _line: None)  # fmt: skip
    sized = size_strategy(study, "reactive")
    assert sized.gpus is not None and served(sized.outcome) >= 0.9
    for region in fleet.regions:
        smaller = sized.fleet.less_one(region.name)
        if smaller is not None:
            run = simulate(smaller, catalog, trace, trace.minutes, "reactive", config)
            assert served(run) < 0.9, region.name


def test_the_simulator_routes_a_miss_as_the_agent_does() -> None:
    """`forward_choice` is `choose_route` vectorised: on random misses (holders with
    and without headroom, unreachable regions, known and unknown promotion
    times) both pick the same outcome and the same region."""
    rng = np.random.default_rng(7)
    n, regions = 2000, 4
    holders = rng.random((n, regions)) < 0.4
    headroom = rng.random((n, regions)) < 0.7
    rtt = rng.choice([20.0, 60.0, 140.0, 200.0, np.inf], size=(n, regions))
    promote_ms = rng.choice([10.0, 100.0, 250.0], size=n)
    known = rng.random(n) < 0.5
    sent, nearest = forward_choice(holders & headroom, rtt, promote_ms, known)
    for i in range(n):
        peers = [
            PeerOption(
                str(q), latency_s=rtt[i, q] / 2000.0, headroom=1.0 if headroom[i, q] else 0.0
            )
            for q in range(regions)
            if holders[i, q] and np.isfinite(rtt[i, q])
        ]
        local = Local(False, promote_ms[i] / 1000.0 if known[i] else None)
        route = choose_route(local, peers, forwarded=False)
        assert (route.where == Where.FORWARD) == bool(sent[i]), i
        if sent[i]:
            assert float(rtt[i, int(route.peers[0])]) == float(rtt[i, nearest[i]]), i


def test_each_site_of_a_region_routes_a_miss_from_its_own_staged_tier() -> None:
    """An agent estimates a promotion only for a model staged at its own site, so
    of a region's two sites, the one with the model staged loads it (promoting
    beats the round trip) and the one without forwards its half to the holder
    in another region; with both staged nothing is forwarded, with neither all."""
    fleet = small_fleet()
    catalog = Catalog(
        names=["m0", "m1"],
        size_bytes=np.array([10**8, 10**8]),
        load_s=np.array([0.01, 0.01]),  # a promotion beats the 60 ms round trip
        compute_ms=np.array([1.0, 1.0]),
        slo_ms=np.array([100.0, 100.0]),
    )

    def serve(staged_at: list[int]) -> tuple[float, list[bool]]:
        state = _Fleet(fleet, catalog, "gdsf")
        west = state.site_ids.index("west-0")
        state.holds[west, 0] = True
        state.promoted[:] = True
        for s in staged_at:
            state.staged[s, 0] = True
        requests = np.zeros((len(state.regions), 2))
        requests[state.regions.index("east"), 0] = 100.0
        out = Outcome("reactive", len(state.site_ids))
        serve_step(state, out, requests, 1, 60.0, True, catalog.compute_ms / 1000, catalog, False)
        east = [state.site_ids.index(f"east-{i}") for i in range(2)]
        return out.forwarded, [bool(state.holds[s, 0]) for s in east]

    east = [0, 1]  # the east sites come first
    assert serve([]) == (100.0, [False, False])
    assert serve([east[1]]) == (50.0, [False, True])
    assert serve(east) == (0.0, [True, False])  # one load: its siblings see it (the default)


def test_the_standard_trace_differs_from_day_to_day() -> None:
    """Per model and day a lognormal factor (sigma 0.3), a trend of up to 20% a
    week, and 5% of the models with one unannounced 10x burst of an hour a day:
    the same hour of two days differs by far more than Poisson noise would."""
    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=1)
    trace = SyntheticTrace(fleet, catalog, 3, TraceKnobs(peak_rps=5000), seed=1)
    day = [trace.rates(d * 1440 + 600.0) for d in range(3)]
    ratio = day[1].sum(axis=0) / np.maximum(day[0].sum(axis=0), 1e-12)
    live = day[0].sum(axis=0) > 0
    assert 0.2 < float(np.log(ratio[live & (ratio > 0)]).std()) < 0.7  # sqrt(2) x 0.3
    assert len(trace.bursty) == pytest.approx(0.05 * len(catalog), abs=15)
    m = int(trace.bursty[0])
    _, regions, starts = trace._day(1)
    r, start = int(regions[0]), float(starts[0])
    inside, before = trace.rates(1440 + start + 30), trace.rates(1440 + start - 30)
    assert inside[r, m] > 5 * before[r, m]
    # With local days, a region past its own midnight has the next day's factor.
    local = SyntheticTrace(fleet, catalog, 3, TraceKnobs(peak_rps=5000, local_days=True), seed=1)
    at = 1440 + 600.0  # 10:00 UTC: 02:00 of the next day in the south (UTC+16)
    utc, own = trace.rates(at), local.rates(at)
    calm = np.setdiff1d(np.nonzero(utc.sum(axis=0) > 0)[0], trace.bursty)
    np.testing.assert_allclose(own[:2, calm], utc[:2, calm], rtol=1e-9)
    np.testing.assert_allclose(
        own[2, calm] / utc[2, calm], (trace._day(2)[0] / trace._day(1)[0])[calm], rtol=1e-9
    )
    quiet = TraceKnobs(peak_rps=5000, day_sigma=0.0, weekly_trend=0.0, daily_burst_share=0.0,
                       bursts_per_day=0)  # fmt: skip
    flat = SyntheticTrace(fleet, catalog, 3, quiet, seed=1)  # the repeatable trace, as before
    same = [flat.rates(d * 1440 + 600.0) for d in (1, 2)]  # Tuesday, Wednesday
    alive = (same[0] > 0) & (same[1] > 0)
    np.testing.assert_allclose(same[0][alive], same[1][alive], rtol=1e-9)


def test_hindsight_knows_the_trace_but_not_what_has_not_happened() -> None:
    """The ceiling for forecasting reads the trace's own rates as they could be
    known at a moment: a burst that begins later, a model not yet launched and
    tomorrow's factor are not known; once they have begun, they are. Only a
    synthetic trace can tell its rates."""
    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=1)
    trace = SyntheticTrace(fleet, catalog, 3, TraceKnobs(peak_rps=5000), seed=1)
    m = int(trace.bursty[0])
    _, regions, starts = trace._day(1)
    r, start = int(regions[0]), 1440 + float(starts[0])
    inside = trace.rates(start + 30)
    np.testing.assert_array_equal(trace.rates(start + 30, known_at=start + 1), inside)
    unknown = trace.rates(start + 30, known_at=start - 10)
    assert inside[r, m] == pytest.approx(10 * unknown[r, m])
    launched = next(j for j in range(len(catalog)) if 60 < trace.launch[j] < 2 * DAY)
    at = float(trace.launch[launched]) + 5
    assert trace.rates(at)[:, launched].sum() > 0
    assert trace.rates(at, known_at=at - 10)[:, launched].sum() == 0
    # Tomorrow, as seen today: today's factor per model stands in for tomorrow's.
    today, tomorrow = trace._day(1)[0], trace._day(2)[0]
    seen = trace.rates(2 * DAY + 600.0, known_at=2 * DAY - 60.0)
    truth = trace.rates(2 * DAY + 600.0)
    live = truth.sum(axis=0) > 0
    quiet = np.setdiff1d(np.nonzero(live)[0], trace.bursty)
    np.testing.assert_allclose(
        seen[:, quiet].sum(axis=0) / truth[:, quiet].sum(axis=0),
        (today / tomorrow)[quiet],
        rtol=1e-9,
    )
    replay = TraceFile([(0, "east", catalog.names[0], 1)], fleet, catalog)
    with pytest.raises(ValueError, match=r"hindsight .* synthetic trace"):
        simulate(fleet, catalog, replay, 2 * DAY, "hindsight", SimConfig(step_min=15))


def test_clairvoyant_placement_knows_the_coming_periods_requests() -> None:
    """The most any forecast could earn: placed from the requests the coming period
    brings. A model first asked for at minute 92 is placed at the placement of
    minute 90, its download done before its first request: every request served in
    region and none late, where reactive placement meets it with a load on demand."""
    fleet, catalog = small_fleet(), standard_catalog(KNOBS, seed=1)
    steady = [(t, "east", catalog.names[0], 30) for t in range(120)]
    sudden = [(t, "east", catalog.names[1], 60) for t in range(92, 97)]
    trace = TraceFile(steady + sudden, fleet, catalog)
    config = SimConfig(step_min=1, placement_period_min=5)
    runs = {s: simulate(fleet, catalog, trace, 120, s, config) for s in ("reactive", "clairvoyant")}
    assert runs["clairvoyant"].requests == runs["reactive"].requests == 60 * 30 + 5 * 60
    assert runs["clairvoyant"].cold_starts == 0 and runs["clairvoyant"].placed_late == 0
    assert runs["reactive"].cold_starts == 1 and runs["reactive"].placed_late == 60
    served = {s: run.in_region_within_slo for s, run in runs.items()}
    assert served["reactive"] < served["clairvoyant"], served


def test_fleet_sizes_are_trimmed_site_by_site() -> None:
    """After the bisection over one factor, each region loses sites one at a time
    while the target holds: the sizes found are per region, not in steps of the
    number of regions."""
    from edgeplex.control_plane.sim.study import trim

    needed = {"east": 3, "west": 5, "south": 1}

    def enough(fleet: FleetSpec) -> bool:
        return all(
            sum(g.count for g in fleet.sites if g.region == r) >= n for r, n in needed.items()
        )

    trimmed = trim(small_fleet(sites_per_region=7), enough)
    assert {g.region: g.count for g in trimmed.sites} == needed
    assert trimmed.gpus == 9


def test_the_staged_tier_is_bounded_by_host_ram_and_staging_costs_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A box whose host RAM holds less than the catalog reads evicted models back
    from disk (at stage_mbps) and keeps within its RAM; downloads are counted once
    per site, and placement's staged lists are fetched, not there for free."""
    catalog = standard_catalog(KNOBS, seed=5)
    trace_fleet = small_fleet()
    trace = SyntheticTrace(trace_fleet, catalog, 0.25, TraceKnobs(peak_rps=2000), 3)
    seen: list[tuple[float, float, float]] = []  # (staged bytes, held bytes, host RAM)
    fit_host = _Fleet.fit_host

    def checked(self: _Fleet, s: int) -> None:
        fit_host(self, s)
        sizes = self.artifact_bytes
        seen.append((sizes[self.staged[s]].sum(), sizes[self.holds[s]].sum(), self.host[s]))

    monkeypatch.setattr(_Fleet, "fit_host", checked)

    def run(host: int, strategy: str, stage_mbps: float = 200.0) -> dict[str, float | int]:
        fleet = trace_fleet.model_copy(deep=True)
        for group in fleet.sites:
            group.host_memory = host
        config = SimConfig(step_min=5, warmup_min=30, stage_mbps=stage_mbps)
        return simulate(fleet, catalog, trace, trace.minutes, strategy, config).summary(120)

    for strategy in ("lru", "reactive"):
        seen.clear()
        small = run(12 * GiB, strategy)
        # What is staged fits the host's RAM, unless the device's models alone do not.
        assert seen and all(staged <= max(host, held) for staged, held, host in seen), strategy
        large = run(200 * GiB, strategy)
        assert small["served_in_region_within_slo"] <= large["served_in_region_within_slo"]
        free = run(12 * GiB, strategy, stage_mbps=float("inf"))
        assert free["served_in_region_within_slo"] >= small["served_in_region_within_slo"]
        # Each site downloads a model at most once; six sites, 120 models.
        assert 0 < small["bytes_downloaded"] <= 6 * int(catalog.size_bytes.sum()), strategy
