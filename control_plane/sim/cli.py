"""`edgeplex simulate`: the trace-driven fleet simulator (docs/simulator.md).

edgeplex simulate --fleet fleet.yaml --catalog catalog.yaml --trace trace.csv --out DIR
edgeplex simulate --standard --days 7 --out DIR
edgeplex simulate --standard --days 1 --write-trace trace.csv   # the generator alone
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a demand trace over a simulated fleet: GPUs saved per strategy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--fleet", type=Path, help="fleet YAML (regions, round trips, sites)")
    p.add_argument("--catalog", type=Path, help="catalog YAML or CSV")
    p.add_argument(
        "--trace", type=Path, action="append", help="CSV or Parquet trace; repeat for Azure days"
    )
    p.add_argument(
        "--azure",
        action="store_true",
        help="--trace files are Azure Functions invocation counts (one per day)",
    )
    p.add_argument("--standard", action="store_true", help="generate the standard fleet")
    p.add_argument("--days", type=float, default=None, help="simulated days (standard: 7)")
    p.add_argument(
        "--seed", type=int, default=0, help="the generator's seed (runs repeat for a seed)"
    )
    p.add_argument("--out", type=Path, help="write report.json and report.html here")
    p.add_argument("--target", type=float, default=0.95, help="served-in-region share to size for")
    p.add_argument("--step-min", type=int, default=1, help="simulated minutes per step")
    p.add_argument(
        "--placement-period-min", type=int, default=5, help="simulated minutes between placements"
    )
    p.add_argument(
        "--churn-cost", type=float, default=None,
        help="placement's hysteresis, req/s per GiB newly loaded (default: the control "
        "plane's churn_cost)",
    )  # fmt: skip
    p.add_argument(
        "--forward-value", type=float, default=None,
        help="what placement counts a request served from another region as worth, against "
        "one served in its own (default: the control plane's forward_value)",
    )  # fmt: skip
    p.add_argument(
        "--history-days", type=float, default=None,
        help="the trace's first days only teach the forecaster (a fleet up for a while); "
        "every strategy is counted after them (default: 2 on traces of 4 days or more, else 0)",
    )  # fmt: skip
    p.add_argument("--search-days", type=float, default=2.0, help="days each sizing run covers")
    p.add_argument(
        "--search-step-min", type=int, default=15,
        help="simulated minutes per step of the sizing runs (coarser steps hide cold starts)",
    )  # fmt: skip
    p.add_argument(
        "--refine", action=argparse.BooleanOptionalAction, default=True,
        help="make the sizes found at --search-step-min exact at --step-min over the same "
        "days (the report's resolution; about 3x the search's time)",
    )  # fmt: skip
    p.add_argument(
        "--model-overhead", default="0",
        help="device memory a resident model takes beyond its weights (CUDA context share, "
        "arena, workspace), e.g. 300MiB",
    )  # fmt: skip
    p.add_argument(
        "--wan-mbps", type=float, default=1000.0,
        help="download rate of a site's first copy of a model, megabits/s (inf: free)",
    )  # fmt: skip
    p.add_argument(
        "--stage-mbps", type=float, default=1000.0,
        help="rate at which a site stages a model into host RAM from its disk, megabytes/s "
        "(a model evicted from RAM is staged again before its promotion; inf: free)",
    )  # fmt: skip
    p.add_argument(
        "--region-rtt-ms", type=float, default=10.0,
        help="round trip from a client to a site of its region, counted against the SLO",
    )  # fmt: skip
    p.add_argument(
        "--bound-cell-min", type=int, default=15, help="the lower bound's grid, in minutes"
    )
    p.add_argument(
        "--jobs", type=int, default=None,
        help="strategies sized at once, each in a worker process (default: one a CPU, "
        "up to 5); the report is the same for any number",
    )  # fmt: skip
    p.add_argument("--write-trace", type=Path, help="write the generated trace as CSV and stop")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from edgeplex.control_plane.sim import report as sim_report
    from edgeplex.control_plane.sim.engine import STRATEGIES, SimConfig
    from edgeplex.control_plane.sim.spec import (
        StandardKnobs,
        load_catalog,
        load_fleet,
        standard_catalog,
        standard_fleet,
    )
    from edgeplex.control_plane.sim.study import Study, run_study
    from edgeplex.control_plane.sim.traces import (
        SyntheticTrace,
        TraceFile,
        TraceKnobs,
        read_azure_functions,
        read_rows,
        write_csv,
    )
    from edgeplex.sizes import parse_size

    knobs, trace_knobs = StandardKnobs(), TraceKnobs()
    if args.standard:
        fleet, catalog = standard_fleet(knobs), standard_catalog(knobs, args.seed)
    elif args.fleet and args.catalog:
        fleet, catalog = load_fleet(args.fleet), load_catalog(args.catalog)
    else:
        print("error: give --standard, or --fleet and --catalog", file=sys.stderr)
        return 2
    days = args.days
    if args.trace:
        regions = [r.name for r in fleet.regions]
        rows = (
            read_azure_functions(args.trace, regions)
            if args.azure
            else (row for path in args.trace for row in read_rows(path))
        )
        trace = TraceFile(rows, fleet, catalog)
        minutes = trace.minutes if days is None else int(days * 1440)
    else:
        days = 7.0 if days is None else days
        trace = SyntheticTrace(fleet, catalog, days, trace_knobs, args.seed)  # type: ignore[assignment]
        minutes = trace.minutes
    if args.write_trace:
        if not isinstance(trace, SyntheticTrace):
            print("error: --write-trace writes the generated trace", file=sys.stderr)
            return 2
        names, regions = catalog.names, [r.name for r in fleet.regions]
        write_csv(args.write_trace, ((t, regions[r], names[m], n) for t, r, m, n in trace.rows()))
        print(f"wrote {args.write_trace}")
        return 0
    if args.out is None:
        print("error: --out DIR is required", file=sys.stderr)
        return 2
    config = SimConfig(
        step_min=args.step_min,
        placement_period_min=args.placement_period_min,
        churn_cost=SimConfig.churn_cost if args.churn_cost is None else args.churn_cost,
        forward_value=SimConfig.forward_value if args.forward_value is None else args.forward_value,
        model_overhead_bytes=parse_size(args.model_overhead),
        wan_mbps=args.wan_mbps,
        stage_mbps=args.stage_mbps,
        region_rtt_ms=args.region_rtt_ms,
    )
    history_days = args.history_days
    if history_days is None:
        history_days = 2.0 if minutes >= 4 * 1440 else 0.0
    history_min = int(history_days * 1440)
    if minutes - history_min <= config.warmup_min + 60:
        print("error: --history-days leaves too little of the trace to count", file=sys.stderr)
        return 2
    study = Study(
        fleet, catalog, trace, minutes, config, args.target, args.search_days,
        args.search_step_min, bound_cell_min=args.bound_cell_min, history_min=history_min,
        refine=args.refine,
        jobs=args.jobs or min(os.cpu_count() or 1, len(STRATEGIES) + 1),  # + the bound
    )  # fmt: skip
    print(
        f"simulating {minutes / 1440:g} days, the first {history_days:g} history for the "
        f"forecaster: {len(fleet.regions)} regions, {fleet.gpus} sites, "
        f"{len(catalog)} models, seed {args.seed}; {study.jobs} run(s) at a time"
    )
    report = run_study(study)
    report["config"] = {
        "days": minutes / 1440,
        "seed": args.seed,
        "target": args.target,
        "regions": [r.name for r in fleet.regions],
        "fleet": fleet.model_dump(),
        "models": len(catalog),
        "standard": asdict(knobs) if args.standard else None,
        "trace": asdict(trace_knobs) if isinstance(trace, SyntheticTrace) else "file",
        "sim": asdict(config),
        "search_days": args.search_days,
        "search_step_min": args.search_step_min,
        "refined": args.refine,
        "history_days": history_days,
    }
    sim_report.write(report, args.out, config.step_min)
    summary = {
        k: report[k] for k in ("lower_bound", "dedicated", "lru", "static", "reactive", "forecast")
    }
    print(json.dumps(summary, indent=1))
    for goal in report["goals"]:  # type: ignore[attr-defined]
        print(f"{'met' if goal['met'] else 'NOT met'}: {goal['goal']} = {goal['value']}")
    print(f"report: {args.out / 'report.html'}")
    return 0
