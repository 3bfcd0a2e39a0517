"""The GPUs-saved study: for each strategy, the smallest fleet that serves the
target share of requests within SLO from their own region, and what it does
there.

The trace's first `history_min` minutes are history: no fleet runs them, but
the forecaster learns from them (engine.learn), as one kept in Redis has
learned from the weeks before. Every strategy runs, and is counted, from there
on, so forecasting is measured as it runs in a fleet that has been up for a
while, not on its first day.

A strategy's GPU count is found by bisection over fleet sizes (every site
group scaled by one factor, one GPU per site), then site by site: one site
fewer in each region in turn, kept while the target still holds, until no
region can lose one. Each candidate is simulated over `search_days` at
`search_step_min` steps (coarser than the final run, so the search stays
cheap). Coarse steps misjudge a fleet at the margin (over the standard week,
15-minute steps sized the central strategies one GPU too many and, with slow
downloads, per-site LRU seven too few), so the size found is then refined
over the same days at the final run's `step_min`: grown a site at a time
while it misses the target, then trimmed site by site again. At that size the strategy is
simulated over the whole trace at `step_min`, which gives the figures
reported. Two counts need
no simulation: the lower bound (sim/bound.py: no placement can do with fewer)
and `dedicated` (one model per GPU: in each region where a model has demand,
the GPUs its regional peak needs), kept as context.

Reactive and forecasting placement are also compared at one fleet size (the
one forecasting needs), so that cold starts at each region's peak onset are
measured side by side on equal hardware.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from edgeplex.control_plane.sim import bound
from edgeplex.control_plane.sim.engine import (
    STRATEGIES,
    Outcome,
    SimConfig,
    peak_rates,
    simulate,
)
from edgeplex.control_plane.sim.spec import Catalog, FleetSpec
from edgeplex.control_plane.sim.traces import DemandSource
from edgeplex.control_plane.sim.workers import Parts, Run, run_side_by_side

MAX_SCALE = 4.0  # search no further than 4x the given fleet


@dataclass
class Study:
    fleet: FleetSpec
    catalog: Catalog
    trace: DemandSource
    minutes: int
    config: SimConfig
    target: float = 0.95
    search_days: float = 2.0
    search_step_min: int = 15
    log: Callable[[str], None] = lambda line: print(line, flush=True)
    bound_cell_min: int = 15  # the lower bound's grid
    history_min: int = 0  # the forecaster learns from these; counted after them
    # Sizes found at `search_step_min` made exact at the final run's steps (`refine`).
    refine: bool = True
    jobs: int = 1  # strategies sized side by side, each in a forked worker (workers.py)


@dataclass
class Sized:
    strategy: str
    gpus: int | None  # None: the target was not reached at MAX_SCALE x the fleet
    fleet: FleetSpec
    outcome: Outcome


def served(outcome: Outcome) -> float:
    return outcome.in_region_within_slo / max(outcome.requests, 1.0)


def size_strategy(study: Study, strategy: str, peak: np.ndarray | None = None) -> Sized:
    """The smallest fleet at which `strategy` meets the target, and its full run
    (`static` places from `peak`, each region's and model's peak rate)."""
    start = study.history_min
    minutes = min(
        study.minutes, start + max(int(study.search_days * 1440), study.config.warmup_min + 60)
    )
    step = study.search_step_min
    period = max(study.config.placement_period_min, step)
    coarse = replace(study.config, step_min=step, placement_period_min=period)
    evaluate = _evaluator(study, strategy, peak, coarse, minutes)

    def trial(factor: float) -> tuple[int, float]:
        fleet = study.fleet.scaled(factor)
        return fleet.gpus, evaluate(fleet)

    lo, hi = 0.0, 1.0
    while trial(hi)[1] < study.target:
        lo, hi = hi, hi * 2
        if hi > MAX_SCALE:
            fleet = study.fleet.scaled(MAX_SCALE)
            final = simulate(
                fleet, study.catalog, study.trace, study.minutes, strategy, study.config,
                peak_rps=peak, start_min=start,
            )  # fmt: skip
            return Sized(strategy, None, fleet, final)
    for _ in range(12):
        gpus_lo, gpus_hi = study.fleet.scaled(lo).gpus, study.fleet.scaled(hi).gpus
        mid = (lo + hi) / 2
        gpus_mid = study.fleet.scaled(mid).gpus
        if gpus_hi - gpus_lo <= max(1, gpus_hi // 50) or gpus_mid in (gpus_lo, gpus_hi):
            break
        if trial(mid)[1] >= study.target:
            hi = mid
        else:
            lo = mid
    fleet = trim(study.fleet.scaled(hi), lambda f: evaluate(f) >= study.target)
    if study.refine and coarse != study.config:
        fine = _evaluator(study, strategy, peak, study.config, minutes)
        fleet = refine(fleet, lambda f: fine(f) >= study.target, study.fleet.scaled(MAX_SCALE).gpus)
    final = simulate(
        fleet, study.catalog, study.trace, study.minutes, strategy, study.config,
        peak_rps=peak, start_min=start,
    )  # fmt: skip
    return Sized(strategy, fleet.gpus, fleet, final)


def _evaluator(
    study: Study, strategy: str, peak: np.ndarray | None, config: SimConfig, minutes: int
) -> Callable[[FleetSpec], float]:
    """The share `strategy` serves in region within the SLO on a fleet, simulated
    from the history's end to `minutes` with `config`; each fleet simulated once."""
    cache: dict[tuple[int, ...], float] = {}

    def evaluate(fleet: FleetSpec) -> float:
        key = tuple(g.count for g in fleet.sites)
        if key not in cache:
            started = time.perf_counter()
            outcome = simulate(
                fleet, study.catalog, study.trace, minutes, strategy, config, False, peak,
                study.history_min,
            )  # fmt: skip
            cache[key] = served(outcome)
            study.log(
                f"  {strategy}: {fleet.gpus} GPUs {list(key)} -> {served(outcome):.2%} in "
                f"region within SLO at {config.step_min}-minute steps "
                f"({time.perf_counter() - started:.1f} s)"
            )
        return cache[key]

    return evaluate


def refine(fleet: FleetSpec, enough: Callable[[FleetSpec], bool], most: int) -> FleetSpec:
    """`fleet`, found at coarse steps, made the smallest that is `enough` at fine
    ones: grown a site at a time, a region at a time in turn, until it is (or has
    `most` GPUs), then trimmed."""
    regions = [r.name for r in fleet.regions]
    grown = 0
    while not enough(fleet):
        if fleet.gpus >= most:
            return fleet
        fleet = fleet.more_one(regions[grown % len(regions)])
        grown += 1
    return trim(fleet, enough)


def trim(fleet: FleetSpec, enough: Callable[[FleetSpec], bool]) -> FleetSpec:
    """`fleet` with sites taken away one at a time, a region at a time in turn, as
    long as what is left is still `enough`."""
    regions = [r.name for r in fleet.regions]
    stuck: set[str] = set()
    while len(stuck) < len(regions):
        for region in regions:
            if region in stuck:
                continue
            smaller = fleet.less_one(region)
            if smaller is not None and enough(smaller):
                fleet = smaller
            else:
                stuck.add(region)
    return fleet


def peak_onset_cold_starts(outcome: Outcome, step_min: int, lead_min: int = 60) -> int:
    """Cold starts (loads on demand) in each region while its demand ramps up to
    the day's peak (`at_peak_onset`)."""
    return int(at_peak_onset(outcome, outcome.timeline.cold_by_region, step_min, lead_min))


def peak_onset_misses(outcome: Outcome, step_min: int, lead_min: int = 60) -> float:
    """Requests from each region, while its demand ramps up to the day's peak, that
    found no site of their region holding their model: cold-started or forwarded
    (`at_peak_onset`). What placement ready before the peak saves."""
    return at_peak_onset(outcome, outcome.timeline.missed_by_region, step_min, lead_min)


def peak_onset_placed_late(outcome: Outcome, step_min: int, lead_min: int = 60) -> float:
    """Of `peak_onset_misses`, those for a model placement put in their region
    within the hour after (engine.LAG_WINDOW_MIN): the misses a placement that
    saw the peak coming would have saved; the rest are for models no placement
    of the run held in that region then."""
    return at_peak_onset(outcome, outcome.timeline.placed_late_by_region, step_min, lead_min)


def at_peak_onset(
    outcome: Outcome, series: list[np.ndarray], step_min: int, lead_min: int = 60
) -> float:
    """`series` [step][region] summed over each region's peak onset: from
    `lead_min` before its daily low until its demand first crosses the midpoint
    between the day's low and high, going up. Summed over regions and (UTC)
    days; a day the timeline covers only in part counts from what it covers."""
    tl = outcome.timeline
    if not tl.demand_rps:
        return 0
    demand = np.array(tl.demand_rps)  # [steps, regions]
    cold = np.array(series)  # [steps, regions]
    per_day = 1440 // step_min
    first = tl.start_min // step_min  # timeline row 0 is this step of the trace
    lead = lead_min // step_min
    total = 0.0
    for day_start in range(-(first % per_day), len(demand), per_day):
        lo, hi = max(0, day_start), min(len(demand), day_start + per_day)
        if hi - lo < per_day // 2:
            continue  # too little of this day to find its low and its rise
        for r in range(demand.shape[1]):
            day = demand[lo:hi, r]
            low_at = int(np.argmin(day))
            mid = (day.min() + day.max()) / 2
            after = day[low_at:]
            crossing = np.nonzero(after >= mid)[0]
            end_at = low_at + (int(crossing[0]) if crossing.size else len(after))
            total += float(cold[max(0, lo + low_at - lead) : lo + end_at + 1, r].sum())
    return total


def run_study(study: Study) -> dict[str, object]:
    started = time.perf_counter()
    n_models = len(study.catalog)
    peak = peak_rates(study.trace, study.minutes, len(study.fleet.regions), n_models)
    report: dict[str, object] = {}
    dedicated = {
        "gpus": dedicated_gpus(study.fleet, study.catalog, peak),
        "served_in_region_within_slo": 1.0,
        "forwarded": 0.0,
        "cold_starts": 0,
        "cold_starts_peak_onset": 0,
        "misses_peak_onset": 0.0,
        "placed_late_peak_onset": 0.0,
        "churn_per_hour": 0.0,
        "bytes_moved": 0,
        "bytes_downloaded": 0,
    }
    # The longest runs first (LRU's sites reload every minute; forecasting's fleet is
    # run again after it): with fewer workers than runs, they start at once.
    runs: dict[str, Run] = {
        strategy: partial(_sized_parts, study, strategy, peak if strategy == "static" else None)
        for strategy in sorted(STRATEGIES, key=("lru", "forecast", "reactive", "static").index)
    }
    runs["lower_bound"] = lambda: {"bound": lower_bound(study)}
    study.log(f"sizing {', '.join(STRATEGIES)} and the lower bound, {study.jobs} at a time")

    def then(name: str, parts: Parts) -> dict[str, Run]:
        # Reactive on forecasting's fleet: cold starts at peak onset on equal hardware.
        if name != "forecast":
            return {}
        equal = parts["fleet"]
        assert isinstance(equal, FleetSpec)
        return {"equal_size": lambda: {"outcome": simulate(
            equal, study.catalog, study.trace, study.minutes, "reactive", study.config,
            start_min=study.history_min,
        )}}  # fmt: skip

    done = run_side_by_side(runs, study.jobs, then)
    report["lower_bound"] = done["lower_bound"]["bound"]
    report["dedicated"] = dedicated
    sized = {strategy: _sized(done[strategy]) for strategy in STRATEGIES}
    for strategy, s in sized.items():
        entry: dict[str, object] = dict(s.outcome.summary(n_models))
        entry["gpus"] = s.gpus
        entry["per_region"] = s.fleet.per_region() if s.gpus is not None else None
        entry.update(_onset(s.outcome, study.config.step_min))
        report[strategy] = entry
    equal, reactive_equal = sized["forecast"].fleet, done["equal_size"]["outcome"]
    assert isinstance(reactive_equal, Outcome)
    report["equal_size"] = {
        "gpus": equal.gpus,
        "per_region": equal.per_region(),
        "reactive": {
            **reactive_equal.summary(n_models),
            **_onset(reactive_equal, study.config.step_min),
        },
        "forecast": report["forecast"],
    }
    report["runtime_s"] = time.perf_counter() - started
    report["_timelines"] = {k: v.outcome for k, v in sized.items()}
    return report


def _sized_parts(study: Study, strategy: str, peak: np.ndarray | None) -> Parts:
    sized = size_strategy(study, strategy, peak)
    study.log(f"{strategy}: {sized.gpus} GPUs")
    return {"gpus": sized.gpus, "fleet": sized.fleet, "outcome": sized.outcome}


def _sized(parts: Parts) -> Sized:
    gpus, fleet, outcome = parts["gpus"], parts["fleet"], parts["outcome"]
    assert isinstance(fleet, FleetSpec) and isinstance(outcome, Outcome)
    return Sized(outcome.strategy, gpus if isinstance(gpus, int) else None, fleet, outcome)


def _onset(outcome: Outcome, step_min: int) -> dict[str, float]:
    return {
        "cold_starts_peak_onset": peak_onset_cold_starts(outcome, step_min),
        "misses_peak_onset": peak_onset_misses(outcome, step_min),
        "placed_late_peak_onset": peak_onset_placed_late(outcome, step_min),
    }


def dedicated_gpus(fleet: FleetSpec, catalog: Catalog, peak_rps: np.ndarray) -> int:
    """(a) One model per GPU: in every region where a model has demand, the GPUs its
    regional peak needs (compute over one GPU's concurrency), at least one."""
    concurrency = np.mean([g.concurrency for g in fleet.sites]) if fleet.sites else 1.0
    need = np.ceil(peak_rps * (catalog.compute_ms / 1000.0)[None, :] / concurrency)
    return int(np.where(peak_rps > 0, np.maximum(need, 1), 0).sum())


def lower_bound(study: Study) -> dict[str, object]:
    """The fewest GPUs any placement could serve the trace with (sim/bound.py), on a
    grid of `bound_cell_min`, counted after the warm-up as the strategies are."""
    started = time.perf_counter()
    cat, fleet = study.catalog, study.fleet
    grid = bound.grid_of(
        study.trace.demand, study.minutes, study.bound_cell_min,
        study.history_min + study.config.warmup_min,
    )  # fmt: skip
    memory = float(np.mean([g.gpu_memory for g in fleet.sites]))
    concurrency = float(np.mean([g.concurrency for g in fleet.sites]))
    gpus, per_region = bound.lower_bound(
        bound.Problem(
            grid,
            cat.size_bytes.astype(np.float64) + study.config.model_overhead_bytes,
            cat.compute_ms,
            cat.slo_ms - study.config.region_rtt_ms,  # the round trip to the site comes first
            bound.Hardware(memory, concurrency),
            study.target,
        )
    )
    return {
        "gpus": gpus,
        "per_region": dict(zip([r.name for r in fleet.regions], per_region, strict=True)),
        "cell_min": study.bound_cell_min,
        "runtime_s": time.perf_counter() - started,
    }
