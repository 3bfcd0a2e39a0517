"""Throughput-aware replicas: how many sites of a region hold a hot model.

Memory decides whether a model fits at a site; throughput decides how many
sites it needs. A model's load in a region is its demand there times its
compute per request, in compute-seconds per second; a site serves `capacity`
of them (its GPU's concurrency). A region gets enough replicas to keep each
under `utilization_target`, and keeps the replicas it has until they would
all run under `utilization_floor`: a band of hysteresis, so that demand
wobbling around a boundary does not load and drop a replica every round.

Pure functions of their arguments, used by `placement.place`.
"""

from __future__ import annotations

import math

import numpy as np


def replicas_wanted(load: float, capacity: float, current: int, target: float, floor: float) -> int:
    """Replicas for `load` (compute-seconds/s) on sites serving `capacity` each.

    Scale up to keep every replica under `target`; keep `current` while they
    average at least `floor` (so a replica removed at `floor` leaves the rest
    under `target`, and one added at `target` leaves them over `floor`).
    """
    if load <= 0 or capacity <= 0:
        return 0
    need = max(1, math.ceil(load / (capacity * target) - 1e-9))
    if current >= need and load / (current * capacity) >= floor:
        return current
    return need


def region_capacity(capacity: list[float], members: list[int]) -> float:
    """What one site of a region serves, on average over the sites that say."""
    known = [capacity[i] for i in members if capacity[i] > 0]
    return float(np.mean(known)) if known else 0.0


def replica_plan(
    demand: np.ndarray,  # [R, M] requests/s by origin region
    compute_s: np.ndarray,  # [M] seconds of compute per request; 0: unknown
    region_cap: list[float],  # [R] capacity of one site there; 0: unknown
    holders_now: dict[tuple[int, int], list[int]],  # (model, region) -> sites holding it
    target: float,
    floor: float,
) -> list[tuple[float, int, int, int]]:
    """(load, model, region, replicas) for every (model, region) that needs two or
    more sites, hottest first. One replica is left to the greedy placement,
    which weighs it against everything else that wants the memory."""
    plan = []
    caps = np.asarray(region_cap, dtype=np.float64)[:, None]
    loads = demand * compute_s[None, :]  # [R, M] compute-seconds/s
    holding = np.zeros_like(loads)
    for (j, r), sites in holders_now.items():
        holding[r, j] = len(sites)
    # Only where one site is not enough, or two or more hold it now, can the
    # answer be two or more (replicas_wanted below decides).
    per_site = np.divide(loads, caps * target, out=np.zeros_like(loads), where=caps > 0)
    maybe = (loads > 0) & (caps > 0) & ((per_site > 1.0) | (holding >= 2))
    rows, cols = np.nonzero(maybe)
    for r, j in zip(rows.tolist(), cols.tolist(), strict=True):
        load = float(loads[r, j])
        want = replicas_wanted(load, region_cap[r], int(holding[r, j]), target, floor)
        if want >= 2:
            plan.append((load, j, r, want))
    plan.sort(key=lambda item: -item[0])
    return plan
