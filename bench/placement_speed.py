"""Placement speed: one `place()` on a large fleet, median of several runs.

    python bench/placement_speed.py [--sites 1000] [--models 10000] [--regions 10]

Goal: 1,000 sites x 10,000 models in at most 1 s (median) on a
2-core machine. Prints the instance, each run and the median.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_instances import make_instance

from edgeplex.control_plane.placement import place


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--models", type=int, default=10000)
    parser.add_argument("--regions", type=int, default=10)
    parser.add_argument("--site-gib", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    inp = make_instance(args.sites, args.models, args.regions, args.site_gib)
    print(
        f"# placement speed: {args.sites} sites x {args.models} models, {args.regions} regions, "
        f"{args.site_gib:g} GiB per site, {len(inp.demand)} demand entries; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    times = []
    for run in range(args.runs):
        started = time.perf_counter()
        result = place(inp)
        times.append(time.perf_counter() - started)
        placed = sum(len(v) for v in result.loaded.values())
        print(
            f"run {run}: {times[-1]:.3f} s, {placed} placements, "
            f"served within SLO {result.served_fraction:.1%}"
        )
    median = statistics.median(times)
    print(f"median {median:.3f} s (goal <= 1.0 s): {'met' if median <= 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
