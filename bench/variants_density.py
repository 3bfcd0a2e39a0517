"""Quantized variants under over-commit: the same catalog, budget and Zipf stream with
and without variants, in one run.

Catalog: the closed-loop benchmark's generated MLPs (~13 MB each, FP32 [-1, 64]
-> 4 Gemm layers of 1024), `--models` of them, with a device budget for a tenth
(10x over-commit). Load: `--clients` closed-loop callers, Zipf 1/rank, single-row
binary HTTP (bench/density_closed_loop.py).

Scenarios, back to back on fresh agents:
- `exact`: every model served as shipped (quality: exact, the default);
- `variants`: every model declares `variants: [int8]` and `quality: any`, with
  the guard's thresholds below; the clock starts once every variant is built
  and checked (they are stored by content under the repository's `.variants`,
  so a later run finds them).

Reported per scenario: SLO attainment, throughput, p50/p99, promotions per
second, the share of requests each variant served, and, for `variants`, the
worst guard figures among the variants that served requests.

    python bench/variants_density.py [--models 40 --duration 20 --clients 8]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

from density_closed_loop import build_catalog, run_scenario

# The catalog's outputs are 1,024 values from random weights, not class scores: their
# top-1 is a near tie that measures noise, so it is not held here (it is still
# reported). Cosine and relative error keep the strict defaults.
GUARD = {"min_cosine": 0.999, "min_top1_agreement": 0.0, "max_rel_error": 0.05}


def variant_settings() -> dict[str, str]:
    return {
        "model_defaults__variants": '["int8"]',
        "model_defaults__quality": "any",
        "model_defaults__variant_guard": json.dumps(GUARD),
    }


def built(model: dict[str, Any]) -> bool:
    return model["tier"] == "staged" and bool(model.get("staged_variant_bytes"))


def worst_served(status: dict[str, dict[str, Any]], served: dict[str, float]) -> dict[str, float]:
    """The worst figures among the variants of models that a variant served."""
    figures = [
        output
        for model in status.values()
        for form, report in model.get("variants", {}).items()
        if report["usable"] and served.get(form)
        for output in report["outputs"].values()
    ]
    if not figures:
        return {}
    return {
        "min_cosine": min(f["cosine"] for f in figures),
        "min_top1_agreement": min(f.get("top1_agreement", 1.0) for f in figures),
        "max_rel_error": max(f["max_rel_error"] for f in figures),
        "max_abs_error": max(f["max_abs_error"] for f in figures),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--factor", type=float, default=10.0, help="over-commit")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    repo = build_catalog(args.models)
    per_model = (repo / "c000" / "1" / "model.onnx").stat().st_size
    slots = args.models / args.factor
    budget = int(per_model * 1.15 * slots)  # session overhead beside the weights
    results = [
        run_scenario("exact", repo, args.models, budget, args),
        run_scenario("variants", repo, args.models, budget, args, variant_settings(), built),
    ]
    print(
        f"# variants under {args.factor:g}x over-commit: {args.models} models of {per_model} "
        f"bytes, budget {budget} bytes; {args.clients} closed-loop clients, Zipf 1/rank, "
        f"{args.duration:g} s per scenario, SLO {args.slo_ms:g} ms, seed {args.seed}; "
        f"guard {GUARD}; {platform.machine()}, {platform.python_version()}"
    )
    print(
        "| scenario | served | failed | req/s | p50 ms | p99 ms | < SLO | promotions/s "
        "| served by int8 |"
    )
    print("|" + " --- |" * 9)
    for r in results:
        served = float(r["served"])  # type: ignore[arg-type]
        share = float(r["variant_requests"]["int8"]) / served if served else 0.0  # type: ignore[index]
        print(
            f"| {r['scenario']} | {r['served']} | {r['failed']} | {r['throughput']:.0f} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['under_slo']:.4f} "
            f"| {r['promotions_per_s']:.1f} | {share:.3f} |"
        )
    exact, variants = results
    status = variants.pop("status")
    worst = worst_served(status, variants["variant_requests"])  # type: ignore[arg-type]
    held: dict[str, list[int]] = {}
    for model in status.values():  # type: ignore[attr-defined]
        for form, size in model.get("measured_bytes", {}).items():
            held.setdefault(form, []).append(size)
    print(
        "session bytes measured (median): "
        + ", ".join(f"{f} {sorted(v)[len(v) // 2]}" for f, v in sorted(held.items()))
    )
    exact.pop("status")
    fewer = 1 - float(variants["promotions_per_s"]) / max(1e-9, float(exact["promotions_per_s"]))  # type: ignore[arg-type]
    per_request = [
        float(r["promotions_per_s"]) / max(1e-9, float(r["throughput"]))  # type: ignore[arg-type]
        for r in (exact, variants)
    ]
    print(
        f"promotions: {fewer:.0%} fewer a second with variants "
        f"({per_request[0]:.2f} vs {per_request[1]:.2f} per request served); "
        f"worst served variant: {worst}"
    )
    if args.json:
        args.json.write_text(json.dumps({"results": results, "worst_served": worst}, indent=2))


if __name__ == "__main__":
    main()
