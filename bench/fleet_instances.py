"""Synthetic fleets for the placement benchmarks: deterministic from a seed.

Regions sit on a ring, 30 ms per hop. Each site has the same device budget.
Model sizes are log-normal (median `median_mib`). Demand per region is Zipf
(alpha 1.0) over a popularity order that is the global one with a regional
shuffle of the tail, so regions agree on the head and differ in the tail.
"""

from __future__ import annotations

import numpy as np

from edgeplex.control_plane.placement import GiB, ModelSpec, PlacementInput, SiteInfo

MiB = 1024**2


def make_instance(
    n_sites: int,
    n_models: int,
    n_regions: int,
    site_gib: float,
    median_mib: float = 200.0,
    total_rps: float | None = None,  # default: 100 req/s per site
    slo_ms: float = 100.0,
    seed: int = 0,
    min_replicas_share: float = 0.0,
) -> PlacementInput:
    rng = np.random.default_rng(seed)
    total_rps = total_rps if total_rps is not None else 100.0 * n_sites
    regions = [f"r{i}" for i in range(n_regions)]
    sites = tuple(
        SiteInfo(f"s{i}", regions[i % n_regions], int(site_gib * GiB), int(4 * site_gib * GiB))
        for i in range(n_sites)
    )
    sizes = np.clip(rng.lognormal(np.log(median_mib * MiB), 1.0, n_models), 1 * MiB, site_gib * GiB)
    min_rep = rng.random(n_models) < min_replicas_share
    models = tuple(
        ModelSpec(f"m{j}", int(sizes[j]), slo_ms=slo_ms, min_replicas=int(min_rep[j]))
        for j in range(n_models)
    )
    demand: dict[tuple[str, str], float] = {}
    ranks = 1.0 / np.arange(1, n_models + 1)
    for region in regions:
        order = np.arange(n_models)
        tail = order[n_models // 10 :]
        rng.shuffle(tail)
        order[n_models // 10 :] = tail
        weights = rng.uniform(0.5, 1.5)
        rates = total_rps / n_regions * weights * ranks / ranks.sum()
        for rank, j in enumerate(order):
            demand[(region, f"m{j}")] = float(rates[rank])
    latency = {}
    for a in range(n_regions):
        for b in range(a + 1, n_regions):
            hops = min(b - a, n_regions - (b - a))
            latency[(regions[a], regions[b])] = 30.0 * hops
    return PlacementInput(sites, models, demand, latency, churn_cost=0.1)
