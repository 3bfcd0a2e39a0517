"""Placement: which models each site keeps `loaded` and `staged`. A pure function.

`place(PlacementInput) -> PlacementResult` reads nothing but its argument and
returns the same result for the same input, so the leader's placement loop,
the benchmarks and the tests run it unchanged (docs/control-plane.md,
"Placement").

The objective, in requests per second (the exact MIP in bench/ maximises the
same expression):

    sum over (region r, model m) of  2**priority(m) * demand(r, m) * w(r, m)
    - churn_cost * (GiB of models newly loaded at a site)

where w(r, m) is the weight of the best site holding m for requests from r:
1 in r itself, forward_value * (1 - latency(r, R) / slo(m)) in a region R
whose latency is under the SLO, 0 otherwise. So demand is served in-region
where it can be, from the nearest region where it cannot, and a placement
that gains less than the cost of moving bytes keeps what it has
(hysteresis). `forward_value` (0.3 by default) is below 1 because the
fleet's goal is service in the client's own region: at 1, a region leaves
out the models a neighbour holds, and its clients pay a round trip for them
whenever the neighbour has headroom (one simulated standard day on 35 GPUs:
95.82% served in region at 0.3, 94.13% at 1; docs/lab-notebook.md).

Constraints: a site's loaded models fit its device budget; models are placed
only at sites that are up, not cordoned (except what they already hold) and
not draining, in allowed regions; pinned models go to every such site;
`min_replicas` sites hold each model where capacity allows; a site's placed
load (demand x compute per request) stays within its throughput, and a hot
model gets as many sites of a region as its load there needs (replicas.py).

The algorithm: pins, minimum replicas and hot models' replicas first; then
greedy on gain per byte over (model, region) choices, in vectorised rounds (a
model's gain changes only when it is placed itself), then the same again into
the room left with the hysteresis off (free room displaces nothing); then, on small
instances, a local search of adds and swaps that recovers what
greedy-by-density strands (the knapsack case).
Within a region sites are equivalent for the objective; a model goes to the
site that already holds it, else to the site with the most free bytes (which
spreads load). bench/placement_quality.py compares it with an exact MIP.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from edgeplex.control_plane.local_search import improve
from edgeplex.control_plane.replicas import region_capacity, replica_plan
from edgeplex.control_plane.staging import staged_models

GiB = 1024**3
# The control plane's defaults (config.py), which the simulator places with too.
CHURN_COST = 2.0
FORWARD_VALUE = 0.3
SWAP_SEARCH_LIMIT = 50_000  # sites x models up to which local search runs


@dataclass(frozen=True)
class SiteInfo:
    site_id: str
    region: str
    device_bytes: int
    host_bytes: int = 0  # 0: no staged tier budget known; staged lists stay short
    up: bool = True
    cordoned: bool = False
    draining: bool = False
    # Throughput: compute-seconds per second the site serves (its GPU's
    # concurrency; 1.0 for a busy share). 0: unknown, memory is the only limit.
    capacity: float = 0.0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    size_bytes: int
    slo_ms: float = 100.0
    min_replicas: int = 0
    regions: frozenset[str] = frozenset()  # empty: any region
    priority: int = 0
    pin: bool = False
    compute_ms: float = 0.0  # per request, in the units of SiteInfo.capacity; 0: unknown
    # (site, bytes) where the model takes other bytes than `size_bytes`: the site
    # runs it as a quantized variant.
    site_bytes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class PlacementInput:
    sites: tuple[SiteInfo, ...]
    models: tuple[ModelSpec, ...]
    demand: dict[tuple[str, str], float]  # (origin region, model) -> requests/s
    latency_ms: dict[tuple[str, str], float]  # (region, region) -> one-way ms; absent: unreachable
    current: dict[str, frozenset[str]] = field(default_factory=dict)  # site -> loaded models
    current_staged: Mapping[str, Collection[str]] = field(default_factory=dict)  # site -> staged
    churn_cost: float = 0.1  # objective units (req/s) per GiB newly loaded
    # What a request served from another region within its SLO is worth, against
    # one served in its own: the nearer region's weight 1 - latency/slo is scaled
    # by it. Below 1, a region keeps what its own clients ask for before what a
    # neighbour could answer for them.
    forward_value: float = FORWARD_VALUE
    # Replicas of a hot model keep each under the target, and are removed only
    # when they would all run under the floor (replicas.py).
    utilization_target: float = 0.8
    utilization_floor: float = 0.4
    # Sites x models up to which the local search runs after greedy (the
    # simulator passes 0: it places hundreds of times per simulated day).
    search_limit: int = SWAP_SEARCH_LIMIT


@dataclass
class PlacementResult:
    loaded: dict[str, list[str]]
    staged: dict[str, list[str]]
    objective: float
    served_fraction: float  # share of demand with a site within its SLO


def latency(inp: PlacementInput, a: str, b: str) -> float:
    if a == b:
        return 0.0
    found = inp.latency_ms.get((a, b), inp.latency_ms.get((b, a)))
    return math.inf if found is None else found


class _Problem:
    """Dense arrays of one input: regions x regions x models weights, demand."""

    def __init__(self, inp: PlacementInput) -> None:
        self.inp = inp
        site_regions = {s.region for s in inp.sites}
        demand_regions = {r for r, _ in inp.demand}
        self.regions = sorted(site_regions | demand_regions)
        self.region_ix = {r: i for i, r in enumerate(self.regions)}
        self.models = list(inp.models)
        self.model_ix = {m.name: i for i, m in enumerate(self.models)}
        n_r, n_m = len(self.regions), len(self.models)
        self.size = np.array([max(1, m.size_bytes) for m in self.models], dtype=np.float64)
        self._sizes = self.size.tolist()
        site_ix = {s.site_id: i for i, s in enumerate(inp.sites)}
        self._site_sizes: dict[int, list[float]] = {}  # sites where a model runs smaller
        for col, spec in enumerate(self.models):
            for site_id, size in spec.site_bytes:
                if site_id in site_ix:
                    at = self._site_sizes.setdefault(site_ix[site_id], list(self._sizes))
                    at[col] = float(max(1, size))
        value = np.array([2.0**m.priority for m in self.models])
        self.demand = np.zeros((n_r, n_m))
        for (region, model), rate in inp.demand.items():
            j = self.model_ix.get(model)
            if j is not None and rate > 0:
                self.demand[self.region_ix[region], j] += rate
        self.value = self.demand * value  # D' = value-weighted demand
        lat = np.full((n_r, n_r), np.inf)
        for x, a in enumerate(self.regions):
            for y, b in enumerate(self.regions):
                lat[x, y] = latency(inp, a, b)
        slo = np.array([max(m.slo_ms, 1e-9) for m in self.models])
        # w[r, R, m]: weight of serving origin r from region R for model m.
        w = 1.0 - lat[:, :, None] / slo[None, None, :]
        w[~np.isfinite(w)] = 0.0
        w = np.clip(w, 0.0, 1.0) * inp.forward_value
        idx = np.arange(n_r)
        w[idx, idx, :] = 1.0
        allowed = np.ones((n_r, n_m), dtype=bool)  # [R, m]: may m be placed in R
        for j, m in enumerate(self.models):
            if m.regions:
                allowed[:, j] = [r in m.regions for r in self.regions]
        self.w = w
        self.allowed = allowed
        # Model-major copies for the per-model updates of the greedy loop.
        self.w_m = np.ascontiguousarray(w.transpose(2, 0, 1))  # [m, r, R]
        self.value_m = np.ascontiguousarray(self.value.T)  # [m, r]

    def sizes_at(self, i: int) -> list[float]:
        """Each model's bytes at site `i` (its variant's where it runs one there)."""
        return self._site_sizes.get(i, self._sizes)


def place(inp: PlacementInput) -> PlacementResult:
    p = _Problem(inp)
    n_r, n_m = len(p.regions), len(p.models)
    sites = list(inp.sites)
    free = [float(s.device_bytes) for s in sites]
    loaded: list[list[int]] = [[] for _ in sites]
    holds: list[set[int]] = [set() for _ in sites]
    current = [
        {p.model_ix[n] for n in inp.current.get(s.site_id, ()) if n in p.model_ix} for s in sites
    ]
    # (model, region) -> sites of that region that hold the model now
    holders: dict[tuple[int, int], list[int]] = {}
    for i, cur in enumerate(current):
        if not sites[i].up or sites[i].draining:
            continue
        for j in cur:
            holders.setdefault((j, p.region_ix[sites[i].region]), []).append(i)
    best = np.zeros((n_m, n_r))  # [m, r]: best weight serving (r, m) so far
    gains = np.einsum("rm,rRm->mR", p.value, p.w)  # [m, R]: value of adding m in R now
    sizes = p.size.tolist()
    site_region = [p.region_ix[s.region] for s in sites]
    placed_regions: list[set[int]] = [set() for _ in range(n_m)]
    by_region: list[list[int]] = [[] for _ in range(n_r)]
    for i, s in enumerate(sites):
        if s.up and not s.draining:
            by_region[p.region_ix[s.region]].append(i)
    room_heaps: list[list[tuple[float, int]]] = [
        [(-free[i], i) for i in members] for members in by_region
    ]
    for heap in room_heaps:
        heapq.heapify(heap)

    capacity = [s.capacity for s in sites]
    compute_s = np.array([m.compute_ms / 1000.0 for m in p.models])
    site_load = [0.0] * len(sites)  # compute-seconds/s placed on each site
    # Plain lists for the per-candidate checks below: a list index costs a tenth of
    # a numpy scalar's, and the greedy loop makes millions of them on a large fleet.
    demand_rows = p.demand.tolist()  # [r][m]
    compute_list = compute_s.tolist()
    allowed_rows = p.allowed.tolist()  # [R][m]
    site_open = [s.up and not s.draining for s in sites]
    site_cordoned = [s.cordoned for s in sites]
    touched: list[tuple[int, int]] = []  # (model, region) placed since `settle`

    def has_throughput(i: int, j: int, r: int) -> bool:
        cap = capacity[i]
        return cap <= 0 or site_load[i] + demand_rows[r][j] * compute_list[j] <= cap

    def may_hold(i: int, j: int) -> bool:
        if not site_open[i] or not allowed_rows[site_region[i]][j]:
            return False
        return not site_cordoned[i] or j in current[i]

    def put(i: int, j: int) -> None:
        free[i] -= p.sizes_at(i)[j]
        loaded[i].append(j)
        holds[i].add(j)
        r = site_region[i]
        placed_regions[j].add(r)
        touched.append((j, r))
        heapq.heappush(room_heaps[r], (-free[i], i))

    def settle() -> None:
        """`best` brought up to date with what was put since the last call (one
        vectorised update, where each put would cost a numpy call)."""
        if touched:
            js, rs = np.array(touched).T
            np.maximum.at(best, js, p.w_m[js, :, rs])
            touched.clear()

    def site_in_region(r: int, j: int) -> int | None:
        """Where m goes in region r: a site already holding it, else the roomiest."""
        size = sizes[j]
        for i in holders.get((j, r), ()):
            fits = free[i] >= size and has_throughput(i, j, r)
            if j not in holds[i] and fits and may_hold(i, j):
                return i
        heap = room_heaps[r]
        skipped = []
        chosen = None
        while heap:
            neg_free, i = heap[0]
            if -neg_free != free[i]:  # stale entry
                heapq.heappop(heap)
                continue
            if -neg_free < size:
                break
            if j in holds[i] or not may_hold(i, j) or not has_throughput(i, j, r):
                skipped.append(heapq.heappop(heap))
                continue
            chosen = i
            break
        for item in skipped:
            heapq.heappush(heap, item)
        return chosen

    # 1. Pinned models: every site that may hold them.
    for j, m in enumerate(p.models):
        if m.pin:
            for i in range(len(sites)):
                if may_hold(i, j) and free[i] >= sizes[j]:
                    put(i, j)

    # 2. Minimum replicas: where they are already, then where demand is.
    for j, m in enumerate(p.models):
        if m.min_replicas <= 0:
            continue
        need = m.min_replicas - sum(j in h for h in holds)
        order = sorted(
            range(len(sites)),
            key=lambda i: (
                j not in current[i],
                -p.demand[p.region_ix[sites[i].region], j],
                -free[i],
                sites[i].site_id,
            ),
        )
        for i in order:
            if need <= 0:
                break
            if j not in holds[i] and may_hold(i, j) and free[i] >= sizes[j]:
                put(i, j)
                need -= 1

    # 2b. Hot models: as many sites of a region as their load there needs, on
    # the sites with the least load (those holding them now first).
    region_cap = [region_capacity(capacity, members) for members in by_region]
    band = (inp.utilization_target, inp.utilization_floor)
    hot = replica_plan(p.demand, compute_s, region_cap, holders, *band)
    for load, j, r, want in hot:
        spare = [i for i in by_region[r] if j not in holds[i] and may_hold(i, j)]
        spare.sort(key=lambda i: (j not in current[i], site_load[i], -free[i]))
        have = sum(j in holds[i] for i in by_region[r])
        for i in [i for i in spare if free[i] >= p.sizes_at(i)[j]][: max(0, want - have)]:
            put(i, j)
        sharing = [i for i in by_region[r] if j in holds[i]]
        for i in sharing:
            site_load[i] += load / len(sharing)

    # 3. Greedy over (model, region) on gain per byte, in rounds. The gain of
    # (m, R) changes only when m itself is placed, so each round takes every
    # model's best region at once (vectorised), places the ROUND best models in
    # score order while room lasts, and re-scores only the models it placed.
    # (Exact lazy greedy would re-score after every placement; rounds trade a
    # little ordering for a 1,000-site fleet placed within a second.)
    churn_per_byte = inp.churn_cost / GiB
    penalty = np.broadcast_to((churn_per_byte * p.size)[:, None], (n_m, n_r)).copy()
    for j, r in holders:
        penalty[j, r] = 0.0
    open_regions = np.array([bool(members) for members in by_region], dtype=bool)
    blocked = ~(p.allowed.T & open_regions[None, :])  # [m, R]: never (again) a candidate
    for j in range(n_m):
        for r in placed_regions[j]:
            blocked[j, r] = True

    def regain(js: list[int]) -> np.ndarray:
        """Fresh gains [len(js), R] of models whose best serving weights changed."""
        return np.einsum(
            "mr,mrR->mR", p.value_m[js], np.maximum(p.w_m[js] - best[js][:, :, None], 0.0)
        )

    dirty = sorted({j for j, _ in touched})  # placed by pins, min replicas or hot models
    settle()
    if dirty:
        gains[dirty] = regain(dirty)
    scores = np.where(blocked, -np.inf, (gains - penalty) / p.size[:, None])
    per_round = max(256, n_m // 20)
    # Two passes: the hysteresis keeps a newcomer out unless it gains its churn
    # cost; then room nothing else wants takes what still gains (free room costs
    # no incumbent its place).
    for fill in (False, True) if inp.churn_cost > 0 else (False,):
        if fill:
            penalty[:] = 0.0
            scores = np.where(blocked | ~np.isfinite(scores), -np.inf, gains / p.size[:, None])
        while n_r and n_m:  # (a fleet with no sites or no models has nothing to place)
            best_region = scores.argmax(axis=1)
            best_score = scores[np.arange(n_m), best_region]
            candidates = np.nonzero(best_score > 0)[0]
            if not len(candidates):
                break
            top = candidates[np.argsort(-best_score[candidates], kind="stable")][:per_round]
            placed = []
            for j, r in zip(top.tolist(), best_region[top].tolist(), strict=True):
                room = room_heaps[r]
                target = site_in_region(r, j) if room and -room[0][0] >= sizes[j] else None
                if target is None:  # room only shrinks: this region is out for this model
                    scores[j, r] = -np.inf
                    continue
                put(target, j)
                site_load[target] += demand_rows[r][j] * compute_list[j]
                placed.append(j)
            if placed:
                blocked_rows = blocked[placed]
                for row, j in enumerate(placed):
                    blocked_rows[row, list(placed_regions[j])] = True
                blocked[placed] = blocked_rows
                settle()
                fresh = gains[placed] = regain(placed)
                rows = (fresh - penalty[placed]) / p.size[placed][:, None]
                keep = np.isfinite(scores[placed])  # regions not ruled out for lack of room
                scores[placed] = np.where(blocked_rows | ~keep, -np.inf, rows)

    settle()
    # 4. Local search on small instances: greedy by density can strand capacity
    # (the knapsack case); dropping up to two models and refilling recovers it.
    if len(sites) * n_m <= inp.search_limit:
        locked = {j for j, m in enumerate(p.models) if m.pin} | {j for _, j, _, _ in hot}
        improve(p, site_region, loaded, holds, free, current, may_hold, churn_per_byte, locked)
        best[:] = 0.0
        for i, held in enumerate(loaded):
            for j in held:
                np.maximum(best[j], p.w_m[j][:, site_region[i]], out=best[j])

    # 5. Staged: per site, the best remaining models for its region, within host RAM.
    staged = staged_models(p, sites, holds, inp.current_staged)

    objective = float((p.value_m * best).sum())
    for i in range(len(sites)):
        at = p.sizes_at(i)
        objective -= churn_per_byte * sum(at[j] for j in loaded[i] if j not in current[i])
    total = p.demand.sum()
    served = float((p.demand.T * (best > 0)).sum() / total) if total > 0 else 1.0
    return PlacementResult(
        loaded={
            s.site_id: sorted(p.models[j].name for j in loaded[i]) for i, s in enumerate(sites)
        },
        staged=staged,
        objective=objective,
        served_fraction=served,
    )


def evaluate(inp: PlacementInput, loaded: dict[str, list[str]] | dict[str, set[str]]) -> float:
    """The objective of any placement (for benchmarks and tests): same formula as place()."""
    p = _Problem(inp)
    best = np.zeros_like(p.demand)
    churn = 0.0
    for s in inp.sites:
        r = p.region_ix[s.region]
        cur = inp.current.get(s.site_id, frozenset())
        for name in loaded.get(s.site_id, ()):
            j = p.model_ix[name]
            np.maximum(best[:, j], p.w[:, r, j], out=best[:, j])
            if name not in cur:
                churn += inp.churn_cost * p.size[j] / GiB
    return float((p.value * best).sum()) - churn
