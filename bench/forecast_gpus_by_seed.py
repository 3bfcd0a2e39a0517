"""Reactive and forecast placement sized over several seeds of the standard
week: how many GPUs each needs, seed by seed, and on average.

    python bench/forecast_gpus_by_seed.py [--seeds 0,1,2,3,4] [--jobs 2] [--wan-mbps 1000]
        [--strategies reactive,forecast,hindsight,clairvoyant]

For each seed this sizes each strategy exactly as `edgeplex simulate
--standard --days 7 --seed N` does (the study's search over the week's third
and fourth days at 15-minute steps, then refined site by site at 1-minute
steps; the first two days are the forecaster's history), and runs each at its
size over the five counted days. Nothing else of the study runs (no lower
bound, no static packing, no per-site LRU), so a seed takes about a third of
the study's time: some 10 minutes here, one core a seed; `--jobs` runs that
many seeds at once.

The goal "forecasting earns its keep" asks for fewer GPUs than reactive at the
same target; one seed's sizes differ by a GPU with the seed alone, so this
prints each seed's sizes and the mean difference of each strategy from
reactive placement's (the first strategy named). `hindsight` (a forecast
without errors, docs/simulator.md) sizes what any forecast of the
forecaster's form could save; `clairvoyant` (placement that knows the coming
period's requests) what any forecast at all could.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from functools import partial
from typing import Any

from edgeplex.control_plane.sim.engine import SimConfig
from edgeplex.control_plane.sim.spec import StandardKnobs, standard_catalog, standard_fleet
from edgeplex.control_plane.sim.study import Study, served, size_strategy
from edgeplex.control_plane.sim.traces import SyntheticTrace, TraceKnobs
from edgeplex.control_plane.sim.workers import Parts, Run, run_side_by_side

DAYS = 7.0
HISTORY_DAYS = 2


def size_seed(
    seed: int, wan_mbps: float, strategies: list[str], horizon_s: float
) -> dict[str, object]:
    """Each strategy's size and what it serves there, for one seed."""
    knobs = StandardKnobs()
    fleet, catalog = standard_fleet(knobs), standard_catalog(knobs, seed)
    trace = SyntheticTrace(fleet, catalog, DAYS, TraceKnobs(), seed)
    config = SimConfig(wan_mbps=wan_mbps, forecast_horizon_s=horizon_s)
    study = Study(
        fleet, catalog, trace, trace.minutes, config,
        history_min=HISTORY_DAYS * 1440, log=lambda line: None,
    )  # fmt: skip
    row: dict[str, object] = {"seed": seed}
    for strategy in strategies:
        sized = size_strategy(study, strategy)
        row[strategy] = {
            "gpus": sized.gpus,
            "per_region": sized.fleet.per_region(),
            "served": served(sized.outcome),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--strategies", default="reactive,forecast")
    parser.add_argument("--jobs", type=int, default=1, help="seeds sized at once")
    parser.add_argument(
        "--wan-mbps", type=float, default=SimConfig.wan_mbps,
        help="a site's download rate for its first copy of a model (megabits a second)",
    )  # fmt: skip
    parser.add_argument(
        "--forecast-horizon-s", type=float, default=SimConfig.forecast_horizon_s,
        help="how far ahead forecast and hindsight place (0: the forecaster's estimate of "
        "the present; the control plane's 0 turns forecasting off, `reactive` here)",
    )  # fmt: skip
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    strategies = args.strategies.split(",")
    base, others = strategies[0], strategies[1:]
    print(
        f"# {platform.node() or 'this machine'}, {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d')}: the standard week, {HISTORY_DAYS} days of history, "
        f"each strategy sized as `edgeplex simulate --standard` sizes it, "
        f"WAN {args.wan_mbps:g} Mbit/s, forecast horizon {args.forecast_horizon_s:g} s, "
        f"{args.jobs} seed(s) at once"
    )
    head = ["seed"]
    for s in strategies:
        head += [f"{s} GPUs (per region)", "served Wed-Sun"]
    head += [f"{s} - {base}" for s in others]
    print(f"| {' | '.join(head)} |")
    print("|" + " --- |" * len(head))
    gaps: dict[str, list[int]] = {s: [] for s in others}
    rows: dict[int, Parts] = {}
    waiting = list(seeds)  # in the order given

    def print_in_order(name: str, row: Parts) -> dict[str, Run]:
        """Each seed's row as soon as the seeds before it are in."""
        rows[int(name)] = row
        while waiting and waiting[0] in rows:
            print_row(rows.pop(waiting.pop(0)))
        return {}

    def print_row(row: Parts) -> None:
        sizes: dict[str, Any] = {s: row[s] for s in strategies}
        cells = [
            f"{sizes[s]['gpus']} {sizes[s]['per_region']} | {sizes[s]['served']:.2%}"
            for s in strategies
        ]
        for s in others:
            if sizes[s]["gpus"] is None or sizes[base]["gpus"] is None:
                cells.append("-")
                continue
            gap = sizes[s]["gpus"] - sizes[base]["gpus"]
            gaps[s].append(gap)
            cells.append(f"{gap:+d}")
        print(f"| {row['seed']} | {' | '.join(cells)} |", flush=True)

    runs: dict[str, Run] = {
        str(seed): partial(size_seed, seed, args.wan_mbps, strategies, args.forecast_horizon_s)
        for seed in seeds
    }
    run_side_by_side(runs, args.jobs, print_in_order)  # forked workers, no pickle
    for s, found in gaps.items():
        if found:
            mean = sum(found) / len(found)
            print(f"mean {s} - {base} over {len(found)} seeds: {mean:+.2f} GPUs")


if __name__ == "__main__":
    main()
