"""What the response cache saves, side by side in one run.

    python bench/response_cache.py [--inputs 1000] [--rounds 3] [--duration 5]
    python bench/response_cache.py --inputs 20000 --uniform --cache-bytes 64KiB  # misses

One agent serves the same MLP (1024 wide, 4 layers) twice: `cached`, with
`response_cache: true`, and `plain`, without. Eight callers that never pause
send one-row binary requests whose input is drawn by Zipf 1/rank from
`--inputs` distinct ones (the few popular inputs an edge model sees again and
again, and a long tail), to one model and then the other, `--rounds` times, so
both see the same machine. Printed: each one's median requests a second and
latency percentiles, their ratio, and the share of `cached`'s requests that
were hits (from its statistics). `--uniform` draws inputs evenly instead, and
`--cache-bytes` sets the agent's `response_cache_bytes`: with a cache far too
small for the inputs, nearly every request misses, which measures what the
cache costs (a digest of the input, a copy of the answer, an eviction).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from common import Agent  # noqa: E402

from edgeplex.agent.catalog import demo  # noqa: E402
from tests.support.load import binary_body, closed_loop  # noqa: E402

WIDTH, LAYERS, CALLERS = 1024, 4, 8


def drive(
    url: str, model: str, bodies: list, duration: float, seed: int, uniform: bool = False
) -> dict:
    """The closed loop the tests use (tests/support/load.py), its figures."""
    shares = np.full(len(bodies), 1 / len(bodies)) if uniform else None
    run = closed_loop(url, [model], CALLERS, duration, seed, bodies=bodies, body_weights=shares)
    result = asyncio.run(run)
    ms = sorted(x * 1000 for x in result.latencies)
    return {
        "rps": len(ms) / result.elapsed,
        "p50_ms": ms[len(ms) // 2],
        "p99_ms": ms[int(len(ms) * 0.99)],
        "failed": sum(n for code, n in result.codes.items() if code != 200),
    }


def cache_counts(agent: Agent) -> tuple[int, int]:
    """`cached`'s hits and successes so far, from its statistics."""
    stats = json.loads(agent.get("/v2/models/cached/stats")[1])["model_stats"][0]["inference_stats"]
    return stats["cache_hit"]["count"], stats["success"]["count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1000, help="distinct inputs, Zipf 1/rank")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--uniform", action="store_true", help="inputs drawn evenly")
    parser.add_argument("--cache-bytes", default="64MiB", help="response_cache_bytes")
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-cache-bench-"))
    for name, config in (("cached", "response_cache: true\n"), ("plain", None)):
        demo.make_mlp(repo / name, width=WIDTH, layers=LAYERS, in_width=WIDTH, config=config)
    rng = np.random.default_rng(0)
    bodies = [
        binary_body(rng.standard_normal((1, WIDTH)).astype(np.float32), binary_output=True)
        for _ in range(args.inputs)
    ]
    agent = Agent(repo, response_cache_bytes=args.cache_bytes)
    url = f"http://{agent.http}"
    try:
        for model in ("cached", "plain"):  # loaded, and the runner's session warm
            drive(url, model, bodies[:1], 0.5, 0)
        warm_hits, warm_served = cache_counts(agent)  # the warm-up's, not counted
        runs: dict[str, list[dict]] = {"plain": [], "cached": []}
        for r in range(args.rounds):
            for model in ("plain", "cached"):
                runs[model].append(drive(url, model, bodies, args.duration, r, args.uniform))
        hits, served = cache_counts(agent)
        hits, served = hits - warm_hits, served - warm_served
    finally:
        agent.stop()
    print(
        f"response cache: MLP {WIDTH} wide x {LAYERS}, {CALLERS} closed-loop callers, "
        f"inputs {'evenly' if args.uniform else 'Zipf 1/rank'} over {args.inputs}, cache "
        f"{args.cache_bytes}, {args.rounds} rounds of {args.duration:g} s each, alternating; "
        f"{platform.node()} {len(os.sched_getaffinity(0))} CPUs"
    )
    median = {m: {k: statistics.median(run[k] for run in rs) for k in rs[0]}
              for m, rs in runs.items()}  # fmt: skip
    for model, row in median.items():
        print(f"  {model:7s} {row['rps']:8.0f} req/s  p50 {row['p50_ms']:.2f} ms  "
              f"p99 {row['p99_ms']:.2f} ms  failed {row['failed']:.0f}")  # fmt: skip
    print(f"  ratio   {median['cached']['rps'] / median['plain']['rps']:.2f}x req/s; "
          f"{hits / max(served, 1):.1%} of cached's requests were hits")  # fmt: skip


if __name__ == "__main__":
    main()
