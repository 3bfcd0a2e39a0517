"""Density: a catalog several times larger than the device budget, driven by an
open-loop Zipf stream, under each eviction policy, side by side in one run.

Catalog: generated MLPs of mixed sizes (mostly ~1-2 MB "small" models, some
~8 MB and ~30 MB), whose total is `--factor` x the device budget. Stream:
Poisson arrivals at `--rate` requests/s for `--duration` s; each picks a model
by Zipf(alpha = 1) over a fixed random popularity order (same seed for every
policy). Requests are HTTP/JSON, each with its own connection pool slot, and
are never held back by slow responses (open loop).

Reported per policy: SLO attainment (share of requests answered 200 within
`--slo-ms`), for all requests and for small models only; throughput (200s per
second); promotions; and, for the `none` baseline, which models it serves.

    python bench/density.py --factor 4 [--budget 48MiB --rate 150 --duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from common import Agent, metric_sum

from edgeplex.agent.catalog import demo
from edgeplex.sizes import parse_size
from tests.support.load import zipf_weights

# (width, layers) -> approximate bytes: 4 * (64*width + (layers-1)*width^2)
KINDS = {"small": (384, 3), "medium": (768, 4), "large": (1536, 4)}
MIX = ["small"] * 7 + ["medium"] * 2 + ["large"]  # 70% / 20% / 10% of models


def model_bytes(width: int, layers: int) -> int:
    return 4 * (64 * width + (layers - 1) * width * width + layers * width)


def build_catalog(repo: Path, total: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    kinds: dict[str, str] = {}
    size = 0
    i = 0
    while size < total:
        kind = MIX[i % len(MIX)]
        width, layers = KINDS[kind]
        name = f"{kind}{i:03d}"
        demo.make_mlp(repo / name, width=width, layers=layers, seed=i, in_width=64)
        kinds[name] = kind
        size += model_bytes(width, layers)
        i += 1
    order = list(kinds)
    rng.shuffle(order)
    return {name: kinds[name] for name in order}  # popularity order: first = most popular


async def drive(
    http: str, models: list[str], weights: np.ndarray, rate: float, duration: float, seed: int
) -> list[tuple[str, int, float, str]]:
    rng = np.random.default_rng(seed)
    n = int(rate * duration)
    gaps = rng.exponential(1 / rate, n)
    picks = rng.choice(len(models), n, p=weights)
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
    )
    results: list[tuple[str, int, float, str]] = []
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(model: str) -> None:
            start = time.perf_counter()
            try:
                async with session.post(
                    f"http://{http}/v2/models/{model}/infer",
                    data=body,
                    timeout=aiohttp.ClientTimeout(total=30),
                ) as r:
                    await r.read()
                    code = r.status
                    cold = r.headers.get("edgeplex-cold-start", "")
            except (aiohttp.ClientError, TimeoutError):
                code, cold = 599, ""
            results.append((model, code, time.perf_counter() - start, cold))

        tasks = []
        t0 = time.perf_counter()
        at = 0.0
        for gap, pick in zip(gaps, picks, strict=True):
            at += gap
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(models[pick])))
        await asyncio.gather(*tasks)
    return results


def summarize(results, kinds, slo_s, duration, only=None) -> dict:
    rows = [r for r in results if only is None or r[0] in only]
    ok = [r for r in rows if r[1] == 200]
    within = [r for r in ok if r[2] <= slo_s]
    small = [r for r in rows if kinds[r[0]] == "small"]
    small_within = [r for r in small if r[1] == 200 and r[2] <= slo_s]
    lat = np.array([r[2] for r in ok]) * 1000 if ok else np.array([0.0])
    by_kind = {}
    for kind in sorted(set(kinds.values())):
        mine = [r for r in rows if kinds[r[0]] == kind]
        hit = [r for r in mine if r[1] == 200 and r[2] <= slo_s]
        by_kind[kind] = round(len(hit) / max(len(mine), 1), 4)
    misses = [r for r in rows if not (r[1] == 200 and r[2] <= slo_s)]
    return {
        # Why requests missed: waited for a promotion, were slow though warm, or failed.
        "misses": {
            "cold": sum(1 for r in misses if r[1] == 200 and r[3]),
            "warm": sum(1 for r in misses if r[1] == 200 and not r[3]),
            "errors": sum(1 for r in misses if r[1] != 200),
        },
        "error_codes": {
            str(c): sum(1 for r in rows if r[1] == c)
            for c in sorted({r[1] for r in rows if r[1] != 200})
        },
        "slo_by_kind": by_kind,
        "requests": len(rows),
        "ok": len(ok),
        "slo_attainment": len(within) / max(len(rows), 1),
        "slo_attainment_small": len(small_within) / max(len(small), 1),
        "throughput_rps": len(ok) / duration,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--budget", default="48MiB")
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--policies", default="none,gdsf,lru,ttl")
    parser.add_argument("--prepack", default="true", choices=["true", "false"])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    budget = parse_size(args.budget)
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-density-"))
    kinds = build_catalog(repo, int(budget * args.factor), args.seed)
    models = list(kinds)
    weights = zipf_weights(len(models), args.alpha)
    catalog_bytes = sum(f.stat().st_size for f in repo.rglob("model.onnx"))
    print(
        f"catalog: {len(models)} models, {catalog_bytes / 2**20:.0f} MiB = "
        f"{catalog_bytes / budget:.1f}x the {args.budget} device budget; "
        f"{args.rate:.0f} req/s for {args.duration:.0f} s, Zipf alpha {args.alpha}, "
        f"SLO {args.slo_ms:.0f} ms, prepack_weights={args.prepack}",
        flush=True,
    )
    report = {}
    served_by_none: set[str] | None = None
    for policy in args.policies.split(","):
        agent = Agent(
            repo,
            device_memory_budget=args.budget,
            eviction_policy=policy,
            lru_max_models=str(max(1, int(len(models) / args.factor))),
            idle_ttl_s="10",
            load_models_at_start="false",
            runner__prepack_weights=args.prepack,
        )
        try:
            # Let background pre-staging finish, so it does not compete with the stream.
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and any(
                m["tier"] == "cached" for m in agent.status().values()
            ):
                time.sleep(0.5)
            # Same warm start for every policy: the most popular models, while they fit.
            for name in models:
                if agent.post(f"/v2/repository/models/{name}/load") != 200:
                    break
                if sum(m["memory_bytes"] for m in agent.status().values()) > 0.9 * budget:
                    break
            before = metric_sum(agent.metrics(), "edgeplex_agent_promotions_total")
            results = asyncio.run(
                drive(agent.http, models, weights, args.rate, args.duration, args.seed)
            )
            promotions = metric_sum(agent.metrics(), "edgeplex_agent_promotions_total") - before
        finally:
            agent.stop()
        summary = summarize(results, kinds, args.slo_ms / 1000, args.duration)
        summary["promotions"] = promotions
        if policy == "none":
            served_by_none = {r[0] for r in results if r[1] == 200}
            summary["models_served"] = len(served_by_none)
        if served_by_none is not None:
            subset = summarize(
                results, kinds, args.slo_ms / 1000, args.duration, only=served_by_none
            )
            summary["throughput_on_none_models_rps"] = subset["throughput_rps"]
        report[policy] = summary
        print(
            f"{policy:>5}: SLO {summary['slo_attainment']:.4f} (small "
            f"{summary['slo_attainment_small']:.4f})  {summary['throughput_rps']:.1f} rps  "
            f"p50 {summary['p50_ms']:.1f} ms  p99 {summary['p99_ms']:.1f} ms  "
            f"promotions {promotions:.0f}  by kind {summary['slo_by_kind']}  "
            f"misses {summary['misses']} codes {summary['error_codes']}"
            + (
                f"  on none's models {summary['throughput_on_none_models_rps']:.1f} rps"
                if "throughput_on_none_models_rps" in summary
                else ""
            ),
            flush=True,
        )
    print(json.dumps({"command": "python bench/density.py " + " ".join(sys.argv[1:])}))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": None}, "report": report}, indent=2, default=str
            )
        )


if __name__ == "__main__":
    main()
