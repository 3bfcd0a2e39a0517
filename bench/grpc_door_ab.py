"""The agent's two gRPC doors side by side, with HTTP for scale, in one run.

Two agents serve the demo repository, one per `grpc_server` (native, grpcio).
h2load (nghttp2, C) drives each door with one pre-framed ModelInferRequest
(binary tensor), and wrk drives the native agent's HTTP door, at 1 and 16 in
flight, in alternating rounds. Native clients on both sides, so no Python
client decides the comparison. Prints the median req/s and mean latency of
each.

    python bench/grpc_door_ab.py [--repo .cache/demo-repo] [--rounds 3] [--duration 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from agent_overhead import MODELS, run_h2load, run_wrk  # noqa: E402
from common import Agent  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(".cache/demo-repo"))
    parser.add_argument("--model", default="mlp_small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args()
    if not (shutil.which("h2load") and shutil.which("wrk")):
        raise SystemExit("needs h2load (nghttp2-client) and wrk")
    width = MODELS[args.model][0]
    agents = {door: Agent(args.repo, grpc_server=door) for door in ("native", "grpcio")}
    runs: dict[tuple[str, int], list[dict]] = {}
    try:
        for agent in agents.values():
            run_h2load(agent.grpc, args.model, width, 4, 1)  # load the model, warm up
        for _ in range(args.rounds):
            for c in (1, 16):
                for door, agent in agents.items():
                    got = run_h2load(agent.grpc, args.model, width, c, args.duration)
                    runs.setdefault((f"gRPC {door}", c), []).append(got)
                got = run_wrk(agents["native"].http, args.model, width, c, args.duration)
                runs.setdefault(("HTTP", c), []).append(got)
    finally:
        for agent in agents.values():
            agent.stop()
    print(
        f"{args.model}, binary tensors, h2load (gRPC) and wrk (HTTP), {args.rounds} alternating "
        f"rounds of {args.duration:g} s; medians; vm {os.cpu_count()} CPUs"
    )
    for c in (1, 16):
        http = statistics.median(r["rps"] for r in runs["HTTP", c])
        for name in ("gRPC native", "gRPC grpcio", "HTTP"):
            rows = runs[name, c]
            rps = statistics.median(r["rps"] for r in rows)
            latency = statistics.median(r["p50_ms"] for r in rows)
            errors = sum(r["errors"] for r in rows)
            print(
                f"c={c:<3} {name:<12} {rps:7.0f} req/s  {latency:6.2f} ms  "
                f"vs HTTP {rps / http:.2f}  errors {errors}"
            )


if __name__ == "__main__":
    main()
