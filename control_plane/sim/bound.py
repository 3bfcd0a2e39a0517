"""The fewest GPUs with which any placement could serve a trace: a lower bound, and
the exact offline optimum on small fleets, which shows how tight the bound is.

Both work on a coarse grid: time cut into cells of `cell_min` minutes, the demand
of each (region, model) in a cell taken at its average rate. Each region gets a
number of GPUs (memory M and concurrency K each, as the fleet's sites), the same
all through the trace, and the count is the fewest in total with which the
requests served in their own region within the SLO reach `target` of all.

`lower_bound` relaxes the problem until it is cheap; each relaxation can only
lower the count, so what it returns is a bound no placement can beat:
- with hindsight and free loads: whatever a cell needs is resident for it;
- a region's GPUs pool their memory and compute (no GPU boundaries);
- residency is fractional: serving a share x of a model's requests in a cell
  costs x of its bytes (the linear relaxation of "resident or not");
- memory and compute are checked apart: a cell serves at most the fewer of what
  its memory alone (most requests per byte first) and its compute alone
  (cheapest requests first) could serve, each a fractional knapsack;
- within a cell the rate is flat (its busiest minute needs more), and a request
  in its region meets the SLO when its compute does (no queueing; the caller
  passes the SLO less the round trip to the site).
What a region serves is then concave in its GPU count (a sum over cells of the
smaller of two concave piecewise-linear functions), so adding GPUs one at a
time where they serve the most requests gives the fewest in total.

`exact_gpus` solves the same coarse-grid problem without the last three
relaxations, as an integer program (scipy's HiGHS): each model resident on a
GPU whole or not at all, each GPU's memory and compute its own. It grows fast
with the instance and is meant for small ones: tests/control_plane/
test_sim_bound.py compares the two there.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Grid:
    """A trace on the coarse grid: requests per [cell, region, model]."""

    requests: np.ndarray  # [T, R, M]
    cell_s: float


@dataclass(frozen=True)
class Hardware:
    memory: float  # bytes of one GPU
    concurrency: float  # requests' worth of compute one GPU completes in parallel


@dataclass(frozen=True)
class Problem:
    """A trace on the grid, the catalog's figures, the GPUs, and the share of the
    requests to serve in region within the SLO."""

    grid: Grid
    size_bytes: np.ndarray  # [M] device bytes of each model
    compute_ms: np.ndarray  # [M]
    slo_ms: np.ndarray  # [M] (less the round trip to the site)
    hardware: Hardware
    target: float


def grid_of(demand, minutes: int, cell_min: int, start_min: int = 0) -> Grid:  # type: ignore[no-untyped-def]
    """`demand(minute, minutes)` (a DemandSource's) summed into cells."""
    cells = [demand(t, cell_min) for t in range(start_min, minutes, cell_min)]
    return Grid(np.array(cells, dtype=np.float64), cell_min * 60.0)


def lower_bound(problem: Problem) -> tuple[int, list[int]]:
    """The bound: the fewest GPUs in total, and their split over the regions."""
    grid, size_bytes, compute_ms = problem.grid, problem.size_bytes, problem.compute_ms
    slo_ms, hardware, target = problem.slo_ms, problem.hardware, problem.target
    n_r = grid.requests.shape[1]
    servable = compute_ms <= slo_ms
    total = float(grid.requests.sum())
    if total == 0:
        return 0, [0] * n_r
    compute_s = compute_ms / 1000.0
    curves = [_region_curve(grid, r, size_bytes, compute_s, servable, hardware) for r in range(n_r)]
    count = [0] * n_r
    served = sum(float(c[0]) for c in curves)
    gains = [(-(float(c[1] - c[0])), r) for r, c in enumerate(curves) if len(c) > 1]
    heapq.heapify(gains)
    while served < target * total - 1e-6 and gains:
        gain, r = heapq.heappop(gains)
        if -gain <= 0:
            break  # nothing more can be served: the target is out of reach
        count[r] += 1
        served += -gain
        curve = curves[r]
        if count[r] + 1 < len(curve):
            heapq.heappush(gains, (-(float(curve[count[r] + 1] - curve[count[r]])), r))
    if served < target * total - 1e-6:
        raise ValueError(f"no fleet serves {target:.0%}: at most {served / total:.1%} can be")
    return sum(count), count


def _region_curve(
    grid: Grid,
    r: int,
    size_bytes: np.ndarray,
    compute_s: np.ndarray,
    servable: np.ndarray,
    hardware: Hardware,
) -> np.ndarray:
    """Requests region r serves over the trace with 0, 1, 2, ... GPUs, up to the
    count that serves all it can."""
    cells = grid.requests[:, r, :] * servable[None, :]  # [T, M]
    # Enough GPUs for every cell's whole demand, by memory and by compute.
    bytes_needed = ((cells > 0) * size_bytes[None, :]).sum(axis=1).max(initial=0.0)
    work_needed = (cells * compute_s[None, :]).sum(axis=1).max(initial=0.0)
    most = max(
        math.ceil(bytes_needed / hardware.memory),
        math.ceil(work_needed / (hardware.concurrency * grid.cell_s)),
    )
    gpus = np.arange(most + 1, dtype=np.float64)
    served = np.zeros(most + 1)
    for n in cells:
        wanted = n > 0
        if not wanted.any():
            continue
        n, size, cost = n[wanted], size_bytes[wanted], compute_s[wanted]
        by_density = np.argsort(-n / size, kind="stable")
        by_memory = np.interp(
            gpus * hardware.memory,
            np.concatenate([[0.0], np.cumsum(size[by_density])]),
            np.concatenate([[0.0], np.cumsum(n[by_density])]),
        )
        cheapest = np.argsort(cost, kind="stable")
        by_compute = np.interp(
            gpus * hardware.concurrency * grid.cell_s,
            np.concatenate([[0.0], np.cumsum((n * cost)[cheapest])]),
            np.concatenate([[0.0], np.cumsum(n[cheapest])]),
        )
        served += np.minimum(by_memory, by_compute)
    return served


def exact_gpus(problem: Problem, most_per_region: int) -> int:
    """The exact optimum of the coarse-grid problem (see the module's docstring),
    with at most `most_per_region` GPUs a region. For small instances."""
    grid, size_bytes, compute_ms = problem.grid, problem.size_bytes, problem.compute_ms
    slo_ms, hardware, target = problem.slo_ms, problem.hardware, problem.target
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    n_t, n_r, n_m = grid.requests.shape
    n_g = most_per_region
    servable = compute_ms <= slo_ms
    demand = grid.requests * servable[None, None, :]
    # Variables: u[r,g] (GPU used), then per (t, r, g, m): a (resident), x (share served).
    n_u = n_r * n_g
    cell = n_r * n_g * n_m

    def u(r: int, g: int) -> int:
        return r * n_g + g

    def a(t: int, r: int, g: int, m: int) -> int:
        return n_u + ((t * n_r + r) * n_g + g) * n_m + m

    def x(t: int, r: int, g: int, m: int) -> int:
        return a(t, r, g, m) + n_t * cell

    n_var = n_u + 2 * n_t * cell
    rows: list[tuple[dict[int, float], float, float]] = []
    for t in range(n_t):
        for r in range(n_r):
            for g in range(n_g):
                memory = {a(t, r, g, m): float(size_bytes[m]) for m in range(n_m)}
                memory[u(r, g)] = -hardware.memory
                rows.append((memory, -np.inf, 0.0))
                work = {
                    x(t, r, g, m): float(demand[t, r, m] * compute_ms[m] / 1000.0)
                    for m in range(n_m)
                }
                work[u(r, g)] = -hardware.concurrency * grid.cell_s
                rows.append((work, -np.inf, 0.0))
                for m in range(n_m):  # served only where resident
                    rows.append(({x(t, r, g, m): 1.0, a(t, r, g, m): -1.0}, -np.inf, 0.0))
            for m in range(n_m):  # a request is served once
                rows.append(({x(t, r, g, m): 1.0 for g in range(n_g)}, -np.inf, 1.0))
    for r in range(n_r):  # GPUs in order: no two solutions the same but for their names
        for g in range(1, n_g):
            rows.append(({u(r, g): 1.0, u(r, g - 1): -1.0}, -np.inf, 0.0))
    reach = {
        x(t, r, g, m): float(demand[t, r, m])
        for t in range(n_t)
        for r in range(n_r)
        for g in range(n_g)
        for m in range(n_m)
    }
    rows.append((reach, target * float(grid.requests.sum()), np.inf))
    matrix = lil_matrix((len(rows), n_var))
    lower, upper = np.empty(len(rows)), np.empty(len(rows))
    for i, (coefficients, lo, hi) in enumerate(rows):
        for j, v in coefficients.items():
            matrix[i, j] = v
        lower[i], upper[i] = lo, hi
    cost = np.zeros(n_var)
    cost[:n_u] = 1.0
    integrality = np.zeros(n_var)
    integrality[: n_u + n_t * cell] = 1  # u and a binary; x continuous
    found = milp(
        cost,
        constraints=LinearConstraint(matrix.tocsr(), lower, upper),
        integrality=integrality,
        bounds=Bounds(np.zeros(n_var), np.ones(n_var)),
    )
    if not found.success:
        raise ValueError(f"no fleet of {n_g} GPUs a region serves {target:.0%}: {found.message}")
    return round(float(found.fun))
