"""Placement quality: edgeplex's placement against an exact MIP and per-site LRU.

    python bench/placement_quality.py [--instances 10] [--sites 20] [--models 100]

For each synthetic instance (bench/fleet_instances.py) it reports the
objective of `place()`, of the exact MIP (OR-Tools SCIP, run in a separate
virtual environment under .cache/mip-venv that this script creates: OR-Tools
pins a protobuf older than the one edgeplex's generated code needs), and the
value plain per-site LRU caching reaches without central placement (each site
caches what its own region's requests touch; a miss is served late, so it
earns nothing). Goal: within 2% of the optimum.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fleet_instances import make_instance  # noqa: E402

from edgeplex.control_plane.placement import GiB, PlacementInput, _Problem, evaluate, place  # noqa: E402

VENV = HERE.parent / ".cache" / "mip-venv"


def ensure_mip_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = subprocess.run([str(python), "-c", "import ortools"], capture_output=True)
    if probe.returncode != 0:
        env = {**os.environ, "PIP_CACHE_DIR": str(HERE.parent / ".cache" / "pip")}
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "ortools>=9.10", "numpy"],
            check=True,
            env=env,
        )
    return python


def solve_exact(python: Path, inp: PlacementInput, time_limit_s: float) -> dict:
    p = _Problem(inp)
    region_ix = p.region_ix
    churn = [
        [
            0.0 if m.name in inp.current.get(s.site_id, ()) else inp.churn_cost * m.size_bytes / GiB
            for m in inp.models
        ]
        for s in inp.sites
    ]
    data = {
        "regions": p.regions,
        "sites": [
            {"id": s.site_id, "region": region_ix[s.region], "cap": s.device_bytes}
            for s in inp.sites
        ],
        "models": [
            {"name": m.name, "size": m.size_bytes, "min_replicas": m.min_replicas}
            for m in inp.models
        ],
        "value": p.value.tolist(),
        "w": p.w.tolist(),
        "churn": churn,
        "time_limit_s": time_limit_s,
    }
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.json", Path(d) / "out.json"
        src.write_text(json.dumps(data))
        subprocess.run([str(python), str(HERE / "mip_solver.py"), str(src), str(dst)], check=True)
        return json.loads(dst.read_text())


def per_site_lru(inp: PlacementInput, requests_per_site: int, seed: int) -> float:
    """Value served in-region when every site LRU-caches its own requests."""
    rng = np.random.default_rng(seed)
    p = _Problem(inp)
    total = 0.0
    sites_in = {r: [s for s in inp.sites if s.region == r] for r in p.regions}
    for site in inp.sites:
        r = p.region_ix[site.region]
        rates = p.value[r] / len(sites_in[site.region])  # this site's share of its region
        if rates.sum() <= 0:
            continue
        stream = rng.choice(len(inp.models), size=requests_per_site, p=rates / rates.sum())
        cache: OrderedDict[int, int] = OrderedDict()
        used, hits, counted = 0, np.zeros(len(inp.models)), np.zeros(len(inp.models))
        warm = requests_per_site // 4
        for t, j in enumerate(stream.tolist()):
            hit = j in cache
            if t >= warm:
                counted[j] += 1
                hits[j] += hit
            if hit:
                cache.move_to_end(j)
                continue
            size = p.models[j].size_bytes
            if size > site.device_bytes:
                continue
            while used + size > site.device_bytes:
                _, evicted = cache.popitem(last=False)
                used -= evicted
            cache[j] = size
            used += size
        rate_hit = np.divide(hits, counted, out=np.zeros_like(hits), where=counted > 0)
        total += float((rates * rate_hit).sum())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=10)
    parser.add_argument("--sites", type=int, default=20)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--regions", type=int, default=4)
    parser.add_argument("--site-gib", type=float, default=1.0)
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    python = ensure_mip_venv()
    print(
        f"# placement quality: {args.instances} instances of {args.sites} sites x {args.models} "
        f"models, {args.regions} regions, {args.site_gib:g} GiB per site, model sizes "
        f"log-normal (median 200 MiB), Zipf demand; MIP = OR-Tools SCIP, "
        f"{args.time_limit:g} s limit"
    )
    print(
        "seed  edgeplex   mip        bound      vs_mip  vs_bound  lru/mip  place_ms  mip_s  optimal"
    )
    ratios, bound_ratios, lru_ratios = [], [], []
    for seed in range(args.instances):
        inp = make_instance(
            args.sites, args.models, args.regions, args.site_gib, seed=seed, min_replicas_share=0.05
        )
        started = time.perf_counter()
        ours = place(inp)
        place_ms = (time.perf_counter() - started) * 1000
        exact = solve_exact(python, inp, args.time_limit)
        check = evaluate(inp, exact["loaded"])
        lru = per_site_lru(inp, 20_000, seed)
        ratio = ours.objective / exact["objective"]
        ratios.append(ratio)
        bound_ratios.append(ours.objective / exact["bound"])
        lru_ratios.append(lru / exact["objective"])
        print(
            f"{seed:<5d} {ours.objective:<10.2f} {exact['objective']:<10.2f} "
            f"{exact['bound']:<10.2f} {ratio:<7.4f} {bound_ratios[-1]:<9.4f} "
            f"{lru_ratios[-1]:<8.3f} {place_ms:<9.1f} {exact['seconds']:<6.1f} {exact['optimal']}"
            + (
                ""
                if abs(check - exact["objective"]) < 1e-6 * max(1, abs(check))
                else f" (eval {check:.2f})"
            )
        )
    worst = min(ratios)
    print(
        f"edgeplex/MIP: mean {statistics.mean(ratios):.4f}, worst {worst:.4f} "
        f"(goal >= 0.98: {'met' if worst >= 0.98 else 'NOT met'}); edgeplex/MIP bound "
        f"(a floor on the true ratio when the MIP stops at its time limit): mean "
        f"{statistics.mean(bound_ratios):.4f}, worst {min(bound_ratios):.4f}; "
        f"per-site LRU/MIP: mean {statistics.mean(lru_ratios):.3f}"
    )


if __name__ == "__main__":
    main()
