"""The agent process's CPU per request, this checkout against another revision,
side by side in one run.

    python bench/cpu_per_request.py --base <git revision> [--rounds 5] [--duration 5]

One agent of each revision (the base is installed once under .cache/ab, as
bench/ab.py does) serves `mlp_small` (512 in, 320 wide, 2 layers), resident.
Each workload drives each agent in turn, alternating which goes first, `--rounds`
times:
  http-c16  wrk, 16 connections, binary tensors (the binary data extension)
  http-c1   wrk, 1 connection
  grpc-c16  tritonclient.grpc.aio, 16 calls in flight
  grpc-c1   tritonclient.grpc.aio, 1 call in flight
For each run it reads the agent process's user+system CPU time from
/proc/<pid>/stat before and after (the agent's own threads; its runners are
other processes and are not counted) and divides by the requests served. It
prints the median CPU per request and throughput of each side and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from ab import base_python  # noqa: E402
from agent_overhead import run_wrk  # noqa: E402
from common import Agent, cpu_seconds  # noqa: E402
from profile_agent import grpc_load  # noqa: E402

from edgeplex.agent.catalog import demo  # noqa: E402

MODEL, WIDTH = "mlp_small", 512


def measured(agent: Agent, drive: Callable[[Agent], dict]) -> dict[str, float]:
    before = cpu_seconds(agent.proc.pid)
    result = drive(agent)
    cpu = cpu_seconds(agent.proc.pid) - before
    return {"rps": result["rps"], "cpu_us": 1e6 * cpu / max(result["requests"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a git revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workloads", help="a comma-separated subset (default: all)")
    args = parser.parse_args()
    sha, python = base_python(args.base)
    d = args.duration
    workloads: dict[str, Callable[[Agent], dict]] = {
        "http-c16": lambda a: run_wrk(a.http, MODEL, WIDTH, 16, d),
        "http-c1": lambda a: run_wrk(a.http, MODEL, WIDTH, 1, d),
        "grpc-c16": lambda a: grpc_load(a.grpc, d, 16, model=MODEL),
        "grpc-c1": lambda a: grpc_load(a.grpc, d, 1, model=MODEL),
    }
    if args.workloads:
        wanted = args.workloads.split(",")
        if unknown := set(wanted) - set(workloads):
            parser.error(f"unknown workloads: {sorted(unknown)}")
        workloads = {w: workloads[w] for w in wanted}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        w: {"this": [], "base": []} for w in workloads
    }
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "repo"
        demo.make_mlp(repo / MODEL, width=320, layers=2, in_width=WIDTH)
        agents = {"this": Agent(repo), "base": Agent(repo, python=python)}
        try:
            for agent in agents.values():
                agent.post(f"/v2/repository/models/{MODEL}/load")
            for r in range(args.rounds):
                for workload, drive in workloads.items():
                    for name in ("this", "base") if r % 2 == 0 else ("base", "this"):
                        runs[workload][name].append(measured(agents[name], drive))
        finally:
            for agent in agents.values():
                agent.stop()
    how = (
        f"this checkout against {sha[:12]}, {MODEL}, binary tensors, "
        f"{args.rounds} rounds of {d:g} s, alternating; {platform.node()} {os.cpu_count()} CPUs"
    )
    print(how)
    print(f"{'workload':<9} {'CPU/request this':>17} {'base':>9} {'ratio':>6}"
          f"   {'rps this':>9} {'base':>8} {'ratio':>6}")  # fmt: skip
    report: dict[str, object] = {"how": how}
    for workload, sides in runs.items():
        row = {
            f"{key}_{name}": statistics.median(run[key] for run in sides[name])
            for name in ("this", "base")
            for key in ("cpu_us", "rps")
        }
        cpu_ratio = row["cpu_us_this"] / row["cpu_us_base"]
        rps_ratio = row["rps_this"] / row["rps_base"]
        report[workload] = row | {"cpu_ratio": cpu_ratio, "rps_ratio": rps_ratio, **sides}
        print(
            f"{workload:<9} {row['cpu_us_this']:14.0f} us {row['cpu_us_base']:6.0f} us "
            f"{cpu_ratio:6.2f}   {row['rps_this']:9.0f} {row['rps_base']:8.0f} {rps_ratio:6.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
