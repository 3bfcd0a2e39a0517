"""Density under closed-loop load: over-commit against everything resident, in one run.

Catalog: generated MLPs of ~13 MB each (FP32 [-1, 64] -> 4 Gemm layers of
1024). Load: `--clients` callers that never pause (each sends its next request
as soon as the last one is answered), each picking a model by Zipf 1/rank over
a fixed popularity order, single-row requests with the tensor in the binary
extension (as tritonclient sends it), over HTTP keep-alive.

Scenarios, back to back in one run (these machines are noisy: compare within
one run only):
- `ceiling-16`: 16 models, no budget, all loaded before the clock starts;
- `4x`: the same 16 models with a device budget for 4;
- `ceiling-160` and `10x`: 160 models, everything resident against a budget
  for 16 (skip with `--factors 4`).

Reported per scenario: requests served, failed (any non-200), throughput and
its ratio to the ceiling, p50/p99 latency, the share under `--slo-ms`,
promotions per second, and the time requests spent waiting for promotions.

`--unpacked` adds each ceiling again with the sessions a promotion on demand
gets (no prepacked weights: runner.prepack_weights false). Against it, the
over-commit scenario's ratio counts what residency costs (promotions, their
messages and bookkeeping) apart from the kernels' speed, which on the CPU
differs with prepacking by about a quarter per batch. With both ceilings
measured, the run also prints an oracle bound per over-commit factor: the
throughput of a policy that keeps the most requested models that fit resident
and prepacked and promotes every other request at no cost (`oracle_bound`).
No residency policy reaches it on the same machine; a goal above it cannot be
met there. `--base REV` then runs
each over-commit scenario `--rounds` more times, alternating between this
checkout and another revision (bench/ab.py makes its environment), for a
change's effect on the same machine in one run.

    python bench/density_closed_loop.py [--duration 20 --clients 8 --factors 4,10]
        [--unpacked] [--base REV --rounds 2]

`--width` and `--layers` size the models (bench/gpu_check.sh runs 16 models of
512 MiB on a GPU, a 2 GiB budget at 4x); the runners' execution provider comes
from the environment (EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import ab
from common import Agent, metric_sum

from edgeplex.agent.catalog import demo
from tests.support.load import binary_body, closed_loop, zipf_weights

WIDTH, LAYERS, IN_WIDTH = 1024, 4, 64
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "bench-closed-loop"


def zipf_share(top: int, count: int) -> float:
    """The share of Zipf 1/rank requests over `count` models that go to the `top`
    most requested."""
    return float(zipf_weights(count)[:top].sum())


def oracle_bound(share: float, packed: float, unpacked: float) -> float:
    """Requests per second that no residency policy beats on this machine: the
    models that take `share` of the requests stay resident with prepacked sessions
    and serve at the ceiling's rate (`packed`, the whole machine's requests per
    second); every other request is promoted at no cost onto the session a
    promotion on demand gets and served at the unpacked ceiling's rate. The
    machine's time per request is the mix of the two. It leaves out what
    promotions cost and assumes batching as in the ceilings: an upper bound."""
    return 1.0 / (share / packed + (1.0 - share) / unpacked)


def build_catalog(count: int, width: int = WIDTH, layers: int = LAYERS) -> Path:
    """`count` models under .cache (built once, reused by later runs)."""
    shape = "" if (width, layers) == (WIDTH, LAYERS) else f"-{width}x{layers}"
    source = CACHE / f"models{shape}"
    missing = [i for i in range(count) if not (source / f"c{i:03d}" / "1" / "model.onnx").is_file()]
    # A process per core: a 512 MiB model takes seconds to generate. Forked, so
    # each inherits its arguments (nothing is pickled to it).
    fork = multiprocessing.get_context("fork")
    cores = os.cpu_count() or 1
    for chunk in (missing[at : at + cores] for at in range(0, len(missing), cores)):
        builds = {
            i: fork.Process(
                target=demo.make_mlp,
                args=(source / f"c{i:03d}", width, layers, i, None, IN_WIDTH),
            )
            for i in chunk
        }
        for build in builds.values():
            build.start()
        for i, build in builds.items():
            build.join()
            if build.exitcode != 0:  # a failed build stops the run here
                raise SystemExit(f"building model c{i:03d} failed (exit {build.exitcode})")
    repo = CACHE / f"repo{shape}-{count}"
    repo.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        link = repo / f"c{i:03d}"
        if not link.exists():
            link.symlink_to(source / f"c{i:03d}")
    return repo


def request_body() -> tuple[bytes, dict[str, str]]:
    """One row, the tensor and the output in binary, as tritonclient sends them."""
    return binary_body(np.full((1, IN_WIDTH), 0.5, np.float32), binary_output=True)


def run_scenario(
    name: str,
    repo: Path,
    count: int,
    budget: int | None,
    args: argparse.Namespace,
    extra: dict[str, str] | None = None,
    settled: Callable[[dict[str, Any]], bool] = lambda model: model["tier"] == "staged",
    python: str = sys.executable,
) -> dict[str, object]:
    """One scenario on a fresh agent (of the checkout `python` has installed); `extra`
    settings go in as EDGEPLEX_AGENT_*, and the clock starts once every model is
    `settled` (over-commit) or loaded."""
    settings = {"prestage": "true", "load_models_at_start": "true" if budget is None else "false"}
    if budget is not None:
        settings["device_memory_budget"] = str(budget)
    agent = Agent(repo, python, **settings, **(extra or {}))
    try:
        models = [f"c{i:03d}" for i in range(count)]
        if budget is None:  # the ceiling: every model loaded before the clock starts
            for model in models:
                agent.post(f"/v2/repository/models/{model}/load")
        else:  # staged, as a warm site would have them
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if all(settled(m) for m in agent.status().values()):
                    break
                time.sleep(0.5)
        before = agent.metrics()
        loop = asyncio.run(
            closed_loop(
                f"http://{agent.http}", models, args.clients, args.duration, args.seed,
                request_body(),
            )
        )  # fmt: skip
        latencies, codes, elapsed = loop.latencies, loop.codes, loop.elapsed
        after = agent.metrics()
        status = agent.status()
    finally:
        agent.stop()

    def delta(metric: str, **labels: str) -> float:
        return metric_sum(after, metric, **labels) - metric_sum(before, metric, **labels)

    lat = np.array(latencies)
    served = codes.get(200, 0)
    return {
        "scenario": name,
        "models": count,
        "budget_bytes": budget,
        "requests": len(latencies),
        "served": served,
        "failed": len(latencies) - served,
        "codes": {str(k): v for k, v in sorted(codes.items())},
        "throughput": served / elapsed,
        "p50_ms": float(np.percentile(lat, 50) * 1000),
        "p99_ms": float(np.percentile(lat, 99) * 1000),
        "under_slo": float((lat < args.slo_ms / 1000).mean()),
        "promotions_per_s": delta("edgeplex_agent_promotions_total") / elapsed,
        "promotion_ms": 1000
        * delta("edgeplex_agent_promotion_duration_seconds_sum")
        / max(1.0, delta("edgeplex_agent_promotion_duration_seconds_count")),
        "promotion_wait_s": delta("edgeplex_agent_promotion_wait_seconds_sum"),
        "waited_requests": delta("edgeplex_agent_promotion_wait_seconds_count"),
        "refused": delta("edgeplex_agent_refused_total"),
        "compute_ms_per_batch": 1000
        * delta("edgeplex_agent_compute_duration_seconds_sum")
        / max(1.0, delta("edgeplex_agent_compute_duration_seconds_count")),
        "requests_per_batch": delta("edgeplex_agent_batch_size_requests_sum")
        / max(1.0, delta("edgeplex_agent_batch_size_requests_count")),
        "variant_requests": {
            form: delta("edgeplex_agent_variant_requests_total", variant=form)
            for form in ("int8", "fp16")
        },
        # Where each model's last promotion ran ("cpu" on a GPU: the CUDA fallback).
        "providers": dict(
            Counter(str(m.get("last_promotion", {}).get("provider", "-")) for m in status.values())
        ),
        "status": status,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--factors", default="4,10", help="over-commit factors to run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--width", type=int, default=WIDTH, help="of each model's layers")
    parser.add_argument("--layers", type=int, default=LAYERS, help="of each model")
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="also run each ceiling with the sessions a promotion on demand gets "
        "(runner.prepack_weights: false), to tell residency's cost from the kernels'",
    )
    parser.add_argument("--base", help="also run each over-commit scenario on this revision")
    parser.add_argument("--rounds", type=int, default=2, help="alternating pairs with --base")
    args = parser.parse_args()
    factors = [int(f) for f in args.factors.split(",")]
    per_model = None
    results = []
    pairs: list[tuple[str, int, float, float]] = []  # scenario, round, this, base
    bounds: list[tuple[str, int, int, float, float, float, float]] = []
    base_python = ab.base_python(args.base)[1] if args.base else ""
    for factor in factors:
        count = 16 * (1 if factor == 4 else 10)
        repo = build_catalog(count, args.width, args.layers)
        per_model = (repo / "c000" / "1" / "model.onnx").stat().st_size
        slots = count // factor
        budget = int(per_model * 1.15 * slots)  # session overhead beside the weights
        results.append(run_scenario(f"ceiling-{count}", repo, count, None, args))
        if args.unpacked:
            unpacked = {"runner__prepack_weights": "false"}
            name = f"ceiling-{count}-unpacked"
            results.append(run_scenario(name, repo, count, None, args, unpacked))
        results.append(run_scenario(f"{factor}x", repo, count, budget, args))
        if args.unpacked:  # the ceiling, its unpacked twin, this over-commit
            rates = [float(r["throughput"]) for r in results[-3:]]  # type: ignore[arg-type]
            share = zipf_share(slots, count)
            bound = oracle_bound(share, rates[0], rates[1])
            results[-1]["oracle_bound"] = bound
            bounds.append((f"{factor}x", slots, count, share, bound, rates[0], rates[2]))
        for r in range(args.rounds if args.base else 0):
            runs = {}
            for side in ("base", "this") if r % 2 == 0 else ("this", "base"):
                python = base_python if side == "base" else sys.executable
                run = run_scenario(f"{factor}x", repo, count, budget, args, python=python)
                runs[side] = float(run["throughput"])  # type: ignore[arg-type]
            pairs.append((f"{factor}x", r, runs["this"], runs["base"]))
    print(
        f"# closed loop: {args.clients} clients, Zipf 1/rank, {args.duration:g} s per "
        f"scenario, single-row binary HTTP, models of {per_model} bytes, SLO {args.slo_ms:g} ms; "
        f"{platform.machine()}, {platform.python_version()}"
    )
    header = (
        "| scenario | served | failed | req/s | vs ceiling | vs unpacked | p50 ms | p99 ms "
        "| < SLO | promotions/s | promotion wait s | compute ms/batch | requests/batch |"
    )
    print(header)
    print("|" + " --- |" * 13)
    ceiling = unpacked_ceiling = 0.0
    for r in results:
        throughput = float(r["throughput"])  # type: ignore[arg-type]
        if str(r["scenario"]).endswith("-unpacked"):
            unpacked_ceiling = throughput
        elif str(r["scenario"]).startswith("ceiling"):
            ceiling, unpacked_ceiling = throughput, 0.0
        ratio = f"{throughput / ceiling:.2f}" if ceiling else "-"
        matched = f"{throughput / unpacked_ceiling:.2f}" if unpacked_ceiling else "-"
        print(
            f"| {r['scenario']} | {r['served']} | {r['failed']} | {throughput:.0f} "
            f"| {ratio} | {matched} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
            f"| {r['under_slo']:.4f} | {r['promotions_per_s']:.1f} "
            f"| {r['promotion_wait_s']:.2f} | {r['compute_ms_per_batch']:.2f} "
            f"| {r['requests_per_batch']:.2f} |"
        )
    if bounds:
        print(
            "\n# oracle bound (--unpacked): the most requested models that fit stay resident "
            "and prepacked, every other request is promoted at no cost and served unpacked"
        )
        print("| scenario | resident | share of requests | bound req/s | bound vs ceiling "
              "| measured vs bound |\n| --- | --- | --- | --- | --- | --- |")  # fmt: skip
        for scenario, slots, count, share, bound, ceiling, measured in bounds:
            print(
                f"| {scenario} | {slots} of {count} | {share:.3f} | {bound:.0f} "
                f"| {bound / ceiling:.2f} | {measured / bound:.2f} |"
            )
    if pairs:
        print(f"\n# this checkout against {args.base}, alternating (req/s)")
        print("| scenario | round | this | base | this/base |\n| --- | --- | --- | --- | --- |")
        for scenario, r, this, base in pairs:
            print(f"| {scenario} | {r} | {this:.0f} | {base:.0f} | {this / base:.2f} |")
        for scenario in dict.fromkeys(p[0] for p in pairs):
            ratios = [p[2] / p[3] for p in pairs if p[0] == scenario]
            print(f"{scenario}: median this/base {statistics.median(ratios):.2f}")
    if args.json:
        for r in results:
            r.pop("status")
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
