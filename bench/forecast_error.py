"""How far the forecaster's forecast is from the standard trace's own rates, hour
by hour of the UTC day.

    python bench/forecast_error.py [--seed 0] [--days 2]

The forecaster learns the week's first two days as the simulator's history,
then, every 5-minute placement period of the next `--days`, observes the
period's requests and forecasts an hour ahead; each forecast is set against
what a forecast without errors would have said then (the simulator's
`hindsight`: the larger of the trace's rates now and an hour ahead, as far as
they were knowable). Prints the absolute error as a share of that demand
(summed over keys, so weighted by rate), split into what was forecast too high
and too low, overall and per UTC hour. Then the same for the present alone:
how far from the trace's rates at that moment are what reactive placement
places from (the demand EWMA of the periods observed) and the forecaster's own
estimate of the present (its forecast at a zero horizon). Takes seconds.
"""

from __future__ import annotations

import argparse

import numpy as np

from edgeplex.control_plane.demand import Demand, ewma
from edgeplex.control_plane.forecast import Forecaster
from edgeplex.control_plane.sim.engine import (
    TRACE_EPOCH,
    SimConfig,
    as_demand,
    hindsight_demand,
    learn,
)
from edgeplex.control_plane.sim.spec import StandardKnobs, standard_catalog, standard_fleet
from edgeplex.control_plane.sim.traces import SyntheticTrace, TraceKnobs

HISTORY_DAYS = 2


def absolute_error(estimate: Demand, truth: Demand) -> float:
    """The summed absolute difference over every key either has."""
    return sum(
        abs(estimate.get(k, 0.0) - truth.get(k, 0.0)) for k in truth.keys() | estimate.keys()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=float, default=2.0)
    args = parser.parse_args()
    knobs, config = StandardKnobs(), SimConfig()
    fleet, catalog = standard_fleet(knobs), standard_catalog(knobs, args.seed)
    trace = SyntheticTrace(fleet, catalog, 7.0, TraceKnobs(), args.seed)
    regions, period = [r.name for r in fleet.regions], config.placement_period_min
    forecaster = Forecaster(recent_half_life_s=config.demand_half_life_s)
    start = HISTORY_DAYS * 1440
    learn(forecaster, trace, start, period, regions, catalog.names)
    error, over, under, demand = (np.zeros(24) for _ in range(4))
    observed: Demand = {}
    present = {"observed": 0.0, "forecaster": 0.0, "demand": 0.0}
    for t in range(start + period, start + int(args.days * 1440), period):
        seen = as_demand(trace.demand(t - period, period) / (period * 60.0), regions, catalog.names)
        now = TRACE_EPOCH + t * 60.0
        forecaster.observe(seen, now)
        observed = ewma(observed, seen, period * 60.0, config.demand_half_life_s)
        truth_now = hindsight_demand(trace, t, 0.0, regions, catalog)
        present["observed"] += absolute_error(observed, truth_now)
        present["forecaster"] += absolute_error(forecaster.predict(now, 0.0), truth_now)
        present["demand"] += sum(truth_now.values())
        forecast = forecaster.predict(now, config.forecast_horizon_s)
        truth = hindsight_demand(trace, t, config.forecast_horizon_s, regions, catalog)
        hour = (t // 60) % 24
        for key in truth.keys() | forecast.keys():
            miss = forecast.get(key, 0.0) - truth.get(key, 0.0)
            error[hour] += abs(miss)
            over[hour] += max(miss, 0.0)
            under[hour] += max(-miss, 0.0)
        demand[hour] += sum(truth.values())
    print(
        f"# the standard week (seed {args.seed}), {args.days:g} days after {HISTORY_DAYS} of "
        f"history, forecasts {config.forecast_horizon_s / 3600:g} h ahead every {period} min"
    )
    total = demand.sum()
    print(
        f"all hours: error {error.sum() / total:.1%} of demand "
        f"(too high {over.sum() / total:.1%}, too low {under.sum() / total:.1%})"
    )
    for hour in range(24):
        d = max(demand[hour], 1e-12)
        print(
            f"{hour:02d}:00 UTC  error {error[hour] / d:6.1%}  too high {over[hour] / d:6.1%}  "
            f"too low {under[hour] / d:6.1%}"
        )
    print(
        f"the present: the observed demand (reactive placement's) off by "
        f"{present['observed'] / present['demand']:.1%} of demand, the forecaster's "
        f"estimate by {present['forecaster'] / present['demand']:.1%}"
    )


if __name__ == "__main__":
    main()
