"""Reactive and forecast placement side by side at given fleet sizes, at the
simulator's full resolution: the standard week at 1-minute steps, counted after
its two days of history, as `edgeplex simulate --standard --days 7` counts it.

    python bench/sim_at_sizes.py [--sizes 6,6,6,6,7 6,6,6,7,7 ...] [--strategies forecast,reactive]
        [--wan-mbps 1000] [--placement-period-min 5] [--seed 0] [--days 5] [--local-days]

`edgeplex simulate` sizes each strategy by a search at 15-minute steps over two
days, which leaves slack; this runs exactly the sizes given (sites per region,
in the standard fleet's region order), so that the smallest size meeting the
target can be read at the resolution the report counts in. Each run takes about
two minutes here. Prints one line per (size, strategy): what it served, its
churn, and at the regions' peak onsets the requests that found no holder in
their region and, of those, the ones placement was late for (a model it put
there within the hour after).

`--strategies hindsight` adds a forecast without errors: placement fed the
trace's own rates now and an hour ahead, as far as they are knowable then (no
burst before it begins, no model before its launch, no day's factor before its
day), in the forecaster's form. What it serves over `reactive` is what a forecast
without errors would earn at that size. `--strategies clairvoyant` places from
the requests the coming period will bring, read from the trace: the most any
forecast could earn (docs/simulator.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from edgeplex.control_plane.sim.engine import SimConfig, simulate
from edgeplex.control_plane.sim.spec import StandardKnobs, standard_catalog, standard_fleet
from edgeplex.control_plane.sim.study import peak_onset_misses, peak_onset_placed_late
from edgeplex.control_plane.sim.traces import SyntheticTrace, TraceKnobs

HISTORY_DAYS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["6,6,6,6,7", "6,6,6,7,7", "6,6,7,7,7"])
    parser.add_argument("--strategies", default="forecast,reactive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--days", type=float, default=5.0,
        help="days counted after the history (5, the rest of the week; 2 is the window "
        "`edgeplex simulate` sizes fleets on)",
    )  # fmt: skip
    parser.add_argument(
        "--placement-period-min", type=int, default=SimConfig.placement_period_min,
        help="simulated minutes between placements (the control plane places every 10 s)",
    )  # fmt: skip
    parser.add_argument(
        "--wan-mbps", type=float, default=SimConfig.wan_mbps,
        help="a site's download rate for its first copy of a model (megabits a second)",
    )  # fmt: skip
    parser.add_argument(
        "--local-days", action="store_true",
        help="draw each model's day factor from each region's local midnight, not UTC's",
    )  # fmt: skip
    args = parser.parse_args()
    knobs = StandardKnobs()
    fleet, catalog = standard_fleet(knobs), standard_catalog(knobs, args.seed)
    trace = SyntheticTrace(fleet, catalog, 7.0, TraceKnobs(local_days=args.local_days), args.seed)
    config = SimConfig(wan_mbps=args.wan_mbps, placement_period_min=args.placement_period_min)
    minutes = min(trace.minutes, int((HISTORY_DAYS + args.days) * 1440))
    print(
        f"# the standard week (seed {args.seed}{', local days' if args.local_days else ''}), "
        f"{args.days:g} days counted after "
        f"{HISTORY_DAYS} days of history at {config.step_min}-minute steps, placement every "
        f"{config.placement_period_min} min, forward_value {config.forward_value}, "
        f"WAN {config.wan_mbps:g} Mbit/s, "
        f"churn_cost {config.churn_cost}; {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}"
    )
    for size in args.sizes:
        counts = [int(n) for n in size.split(",")]
        if len(counts) != len(fleet.sites):
            parser.error(f"--sizes {size}: give one count per region ({len(fleet.sites)})")
        groups = [
            g.model_copy(update={"count": n}) for g, n in zip(fleet.sites, counts, strict=True)
        ]
        sized = fleet.model_copy(update={"sites": groups})
        for strategy in args.strategies.split(","):
            started = time.perf_counter()
            outcome = simulate(
                sized, catalog, trace, minutes, strategy, config, True, None,
                HISTORY_DAYS * 1440,
            )  # fmt: skip
            s = outcome.summary(len(catalog))
            print(
                f"{sized.gpus} GPUs {counts} {strategy}: "
                f"{s['served_in_region_within_slo']:.2%} in region within SLO, "
                f"{s['served_within_slo']:.2%} within SLO, churn {s['churn_per_hour']:.1%}/h, "
                f"{s['cold_starts']:,} cold starts; at peak onset "
                f"{peak_onset_misses(outcome, config.step_min):,.0f} misses, "
                f"{peak_onset_placed_late(outcome, config.step_min):,.0f} placed late "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
