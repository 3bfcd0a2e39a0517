"""The fleet simulator's engine: the control loop stepped over simulated time.

Every step (`step_min` simulated minutes) reads the trace's requests per
(region, model) and serves them the way the fleet would:

1. For the central strategies (`reactive`, `forecast`), every
   `placement_period_min` the demand the control plane would have seen feeds
   the real placement (`control_plane.placement.place`, with each site's
   concurrency and each model's compute, and the last placement as its
   incumbents, as the planner does); each site then holds what it says
   (what it drops is demoted, what is new loaded). `reactive` feeds it the
   real EWMA (`control_plane.demand.ewma`); `forecast` the real `Forecaster`.
2. Requests from region r for model m go to the sites of r that hold m,
   split evenly. With none, the central strategies forward to the nearest
   region holding it if the round trip plus the compute fits the SLO;
   otherwise the model is loaded on demand at the site of r with the most
   free memory, making room with the agent's real eviction policy object
   (GDSF for edgeplex, LRU for `lru`) after the step's use of what is held
   is counted. A site loads one model at a time: a cold start's requests
   miss the SLO until the loads before it and its own are done.
3. Each site's utilisation is the compute of what it serves over its
   concurrency; a site over 1 serves only 1/utilisation of its requests in
   time.

`lru` is per-site LRU caching with no central placement: the same agents
without placement or forwarding.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from edgeplex.agent.residency.policies import (
    Candidate,
    EvictionPolicy,
    GreedyDualSizeFrequency,
    LeastRecentlyUsedByCount,
)
from edgeplex.control_plane.demand import ewma
from edgeplex.control_plane.forecast import Forecaster
from edgeplex.control_plane.placement import ModelSpec, PlacementInput, SiteInfo, place
from edgeplex.control_plane.sim.spec import Catalog, FleetSpec
from edgeplex.control_plane.sim.traces import DemandSource

STRATEGIES = ("lru", "reactive", "forecast")
TRACE_EPOCH = 4 * 86400.0  # unix time of the trace's minute 0: Monday 1970-01-05 00:00 UTC


@dataclass
class SimConfig:
    step_min: int = 1
    placement_period_min: int = 5
    demand_half_life_s: float = 60.0  # the control plane's default
    forecast_horizon_s: float = 3600.0
    churn_cost: float = 0.1
    # Simulated, not counted: every strategy starts from an empty fleet.
    warmup_min: int = 60


@dataclass
class Timeline:
    """Per step, for the report's plots."""

    demand_rps: list[list[float]] = field(default_factory=list)  # [step][region]
    gpus_in_use: list[int] = field(default_factory=list)
    cold_starts: list[int] = field(default_factory=list)
    forwarded_share: list[float] = field(default_factory=list)
    holders: list[np.ndarray] = field(default_factory=list)  # [step] -> sites per model
    cold_by_region: list[np.ndarray] = field(default_factory=list)  # [step][region]
    start_min: int = 0  # the trace minute of the first step recorded (after the warm-up)


@dataclass
class Outcome:
    strategy: str
    gpus: int
    requests: float = 0.0
    in_region_within_slo: float = 0.0
    forwarded: float = 0.0
    forwarded_within_slo: float = 0.0
    cold_starts: int = 0
    models_moved: int = 0  # (model, hour) pairs whose placement changed
    models_cached: int = 0  # (model, hour) pairs whose holders loads on demand changed
    bytes_moved: int = 0
    hours: float = 0.0
    timeline: Timeline = field(default_factory=Timeline)

    def summary(self, n_models: int) -> dict[str, float | int]:
        total = max(self.requests, 1.0)
        return {
            "gpus": self.gpus,
            "requests": int(self.requests),
            "served_in_region_within_slo": self.in_region_within_slo / total,
            "served_within_slo": (self.in_region_within_slo + self.forwarded_within_slo) / total,
            "forwarded": self.forwarded / total,
            "cold_starts": self.cold_starts,
            "churn_per_hour": self.models_moved / max(self.hours, 1e-9) / max(n_models, 1),
            "on_demand_churn_per_hour": self.models_cached
            / max(self.hours, 1e-9)
            / max(n_models, 1),
            "bytes_moved": self.bytes_moved,
        }


class _Fleet:
    """Dense state of one simulated fleet."""

    def __init__(self, fleet: FleetSpec, catalog: Catalog, policy: str) -> None:
        self.regions = [r.name for r in fleet.regions]
        region_ix = {r: i for i, r in enumerate(self.regions)}
        self.site_ids: list[str] = []
        region: list[int] = []
        memory: list[int] = []
        concurrency: list[float] = []
        for g in fleet.sites:
            for _ in range(g.count):
                self.site_ids.append(f"{g.region}-{region.count(region_ix[g.region])}")
                region.append(region_ix[g.region])
                memory.append(g.gpu_memory)
                concurrency.append(g.concurrency)
        self.region = np.array(region, dtype=np.int64)
        self.memory = np.array(memory, dtype=np.float64)
        self.concurrency = np.array(concurrency)
        n_s, n_m, n_r = len(self.site_ids), len(catalog), len(self.regions)
        self.onehot = np.zeros((n_r, n_s))
        self.onehot[self.region, np.arange(n_s)] = 1.0
        self.holds = np.zeros((n_s, n_m), dtype=bool)
        self.placed = np.zeros((n_s, n_m), dtype=bool)  # what placement loads where
        self.moved = np.zeros(n_m, dtype=bool)  # placement changed this hour
        self.cached = np.zeros(n_m, dtype=bool)  # loads on demand changed holders this hour
        self.bytes_loaded = 0
        self.last_used = np.zeros((n_s, n_m))
        self.freq = np.zeros((n_s, n_m))
        self.credit = np.zeros((n_s, n_m))
        self.size = catalog.size_bytes.astype(np.float64)
        self.load_s = catalog.load_s
        self.policies: list[EvictionPolicy] = [
            LeastRecentlyUsedByCount(1 << 30) if policy == "lru" else GreedyDualSizeFrequency()
            for _ in range(n_s)
        ]
        rtt = np.array([[fleet.rtt(a, b) for b in self.regions] for a in self.regions])
        self.rtt = rtt

    def used(self, s: int) -> float:
        return float(self.size[self.holds[s]].sum())

    def load_on_demand(self, s: int, wanted: list[int], now: float) -> list[int]:
        """Load `wanted` at site s, making room with the site's policy (one decision
        for the batch, as a burst of promotions at an agent); returns what loaded."""
        wanted = [m for m in wanted if self.size[m] <= self.memory[s]]
        need = float(self.size[wanted].sum()) - (self.memory[s] - self.used(s))
        if need > 0:
            held = np.nonzero(self.holds[s])[0]
            candidates = [
                Candidate(
                    name=str(j),
                    bytes=int(self.size[j]),
                    promote_s=float(self.load_s[j]),
                    last_used=float(self.last_used[s, j]),
                    frequency=float(self.freq[s, j]),
                    credit=float(self.credit[s, j]),
                )
                for j in held
            ]
            victims = self.policies[s].choose(candidates, int(need), len(held), now)
            if victims is None:  # not all of it fits: evict everything, load what fits
                victims = candidates
            for v in victims:
                self.holds[s, int(v.name)] = False
                self.cached[int(v.name)] = True
        loaded = []
        room = self.memory[s] - self.used(s)
        for m in wanted:
            if self.size[m] > room:
                continue
            room -= self.size[m]
            loaded.append(m)
            self.holds[s, m] = True
            self.cached[m] = True
            self.freq[s, m] = 0.0
            self.last_used[s, m] = now
            self.credit[s, m] = self.policies[s].stamp()
            self.bytes_loaded += int(self.size[m])
        return loaded


def simulate(
    fleet: FleetSpec,
    catalog: Catalog,
    trace: DemandSource,
    minutes: int,
    strategy: str,
    config: SimConfig | None = None,
    record: bool = True,
) -> Outcome:
    config = config or SimConfig()
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    state = _Fleet(fleet, catalog, "lru" if strategy == "lru" else "gdsf")
    if minutes <= config.warmup_min:
        raise ValueError(f"the trace must be longer than the warm-up ({config.warmup_min} min)")
    out = Outcome(strategy, gpus=len(state.site_ids), hours=minutes / 60.0)
    central = strategy != "lru"
    specs = tuple(
        ModelSpec(
            name=n,
            size_bytes=int(catalog.size_bytes[j]),
            slo_ms=float(catalog.slo_ms[j]),
            compute_ms=float(catalog.compute_ms[j]),
        )
        for j, n in enumerate(catalog.names)
    )
    sites = tuple(
        SiteInfo(
            site_id=sid,
            region=state.regions[state.region[i]],
            device_bytes=int(state.memory[i]),
            capacity=float(state.concurrency[i]),
        )
        for i, sid in enumerate(state.site_ids)
    )
    latency = {
        (a, b): float(state.rtt[i, k]) / 2.0
        for i, a in enumerate(state.regions)
        for k, b in enumerate(state.regions)
        if i < k and np.isfinite(state.rtt[i, k])
    }
    compute_s = catalog.compute_ms / 1000.0
    fits_remote = (state.rtt[:, :, None] + catalog.compute_ms[None, None, :]) <= catalog.slo_ms
    demand_seen: dict[tuple[str, str], float] = {}
    demand_at = 0.0
    forecaster = Forecaster(recent_half_life_s=config.demand_half_life_s)
    period_requests = np.zeros((len(state.regions), len(catalog)))
    period_start = 0
    step = config.step_min
    counting, hour, placed_at = False, 0, 0
    for t in range(0, minutes, step):
        now = TRACE_EPOCH + t * 60.0
        if not counting and t >= config.warmup_min:  # count from here on
            counting = True
            out = Outcome(strategy, gpus=out.gpus, hours=(minutes - t) / 60.0)
            out.timeline.start_min = t
            state.bytes_loaded = 0
            state.moved[:] = state.cached[:] = False
            hour = t // 60
        elif counting and t // 60 != hour:
            hour = t // 60
            out.models_moved += int(state.moved.sum())
            out.models_cached += int(state.cached.sum())
            state.moved[:] = state.cached[:] = False
        if central and (t == 0 or t - placed_at >= config.placement_period_min):
            placed_at = t
            if t > 0:
                rates = period_requests / ((t - period_start) * 60.0)
                seen = _as_demand(rates, state.regions, catalog.names)
                demand_seen = ewma(demand_seen, seen, now - demand_at, config.demand_half_life_s)
                demand_at = now
                forecaster.observe(seen, now)
            planned = (
                forecaster.predict(now, config.forecast_horizon_s)
                if strategy == "forecast"
                else demand_seen
            )
            _apply_placement(state, out, sites, specs, planned, latency, config, catalog, now)
            period_requests[:] = 0.0
            period_start = t
        requests = trace.demand(t, step)
        period_requests += requests
        _serve(state, out, requests, step, now, central, compute_s, fits_remote, catalog, record)
    out.models_moved += int(state.moved.sum())
    out.models_cached += int(state.cached.sum())
    out.bytes_moved = state.bytes_loaded
    return out


def _as_demand(
    rates: np.ndarray, regions: list[str], names: list[str]
) -> dict[tuple[str, str], float]:
    r_ix, m_ix = np.nonzero(rates > 1e-6)
    return {(regions[r], names[m]): float(rates[r, m]) for r, m in zip(r_ix, m_ix, strict=True)}


def _apply_placement(state, out, sites, specs, demand, latency, config, catalog, now) -> None:  # type: ignore[no-untyped-def]
    names = catalog.names
    current = {
        sid: frozenset(names[j] for j in np.nonzero(state.placed[i])[0])
        for i, sid in enumerate(state.site_ids)
    }
    result = place(
        PlacementInput(
            sites=sites,
            models=specs,
            demand=demand,
            latency_ms=latency,
            current=current,
            churn_cost=config.churn_cost,
            search_limit=0,  # greedy only, as the control plane places large fleets
        )
    )
    index = {n: j for j, n in enumerate(names)}
    before, placed_before = state.holds.copy(), state.placed.copy()
    state.placed[:] = False
    for i, sid in enumerate(state.site_ids):
        for name in result.loaded.get(sid, ()):
            state.placed[i, index[name]] = True
    state.holds[:] = state.placed  # agents demote what the desired state does not load
    added = state.holds & ~before
    state.bytes_loaded += int((added * state.size[None, :]).sum())
    state.moved |= np.any(state.placed != placed_before, axis=0)
    for i, j in zip(*np.nonzero(added), strict=True):
        state.last_used[i, j] = now
        state.freq[i, j] = 0.0
        state.credit[i, j] = state.policies[i].stamp()


def _serve(
    state, out, requests, step, now, central, compute_s, fits_remote, catalog, record
) -> None:  # type: ignore[no-untyped-def]
    n_r = len(state.regions)
    step_s = step * 60.0
    holders = state.onehot @ state.holds  # [R, M] sites holding m in region r
    wanted = requests > 0
    served_at = np.where(holders > 0, requests, 0.0)  # [R(serving), M] requests
    cold = np.zeros(n_r, dtype=np.int64)
    forwarded_at = np.zeros_like(served_at)  # the part of served_at that was forwarded
    rs, ms = np.nonzero(wanted & (holders == 0))
    if central and rs.size:  # forward each to the nearest region holding it within the SLO
        reach = (holders[:, ms].T > 0) & fits_remote[rs, :, ms]  # [miss, region]
        nearest = np.where(reach, state.rtt[rs], np.inf).argmin(axis=1)
        sent = reach.any(axis=1)
        np.add.at(served_at, (nearest[sent], ms[sent]), requests[rs[sent], ms[sent]])
        np.add.at(forwarded_at, (nearest[sent], ms[sent]), requests[rs[sent], ms[sent]])
        rs, ms = rs[~sent], ms[~sent]
    misses: dict[int, list[int]] = {}  # region -> models it must load
    for r, m in zip(rs.tolist(), ms.tolist(), strict=True):
        misses.setdefault(r, []).append(m)
    # The models held at the step's start serve it, and are credited with that
    # use before its loads on demand choose victims (an agent sees each request
    # as it comes; a step that counted use after its evictions made the models
    # placement had just loaded, with no use yet, the cheapest victims).
    before = state.holds.copy()
    first = before * np.where(holders > 0, served_at / np.maximum(holders, 1), 0.0)[state.region]
    state.freq += first
    state.last_used[first > 0] = now
    # Cold starts: each region's misses go to its sites with the most free memory.
    for r, models in misses.items():
        members = np.nonzero(state.region == r)[0]
        if members.size == 0:
            continue  # no site in the region: every request misses
        free = state.memory[members] - (state.holds[members] * state.size).sum(axis=1)
        heap = [(-float(f), int(i)) for f, i in zip(free, members, strict=True)]
        heapq.heapify(heap)
        batches: dict[int, list[int]] = {}
        for m in sorted(models, key=lambda j: -requests[r, j]):
            room, i = heapq.heappop(heap)
            batches.setdefault(i, []).append(m)
            heapq.heappush(heap, (room + float(state.size[m]), i))
        for i, batch in batches.items():
            # A site loads one model at a time (the agent's runner creates
            # sessions one after another): each waits for the loads before it.
            ready_s = 0.0
            for m in state.load_on_demand(i, batch, now):
                ready_s += catalog.load_s[m]
                holders[r, m] += 1
                cold[r] += 1
                served_at[r, m] += requests[r, m] * (1.0 - min(1.0, ready_s / step_s))
    # Spread what each region serves over its holders, a victim of this step's
    # loads included (it served until then); utilisation per site.
    serving = before | state.holds
    holders = state.onehot @ serving
    spread = np.maximum(holders, 1)
    per_site = serving * np.where(holders > 0, served_at / spread, 0.0)[state.region]
    per_site_fwd = serving * (forwarded_at / spread)[state.region]
    util = (per_site * compute_s[None, :]).sum(axis=1) / (state.concurrency * step_s)
    in_time = np.minimum(1.0, 1.0 / np.maximum(util, 1e-12))  # [S]
    fits = (catalog.compute_ms <= catalog.slo_ms).astype(np.float64)
    total_in_time = float(((per_site * fits).sum(axis=1) * in_time).sum())
    forwarded_in_time = float(((per_site_fwd * fits).sum(axis=1) * in_time).sum())
    forwarded = float(forwarded_at.sum())
    share = per_site  # what each site served of each model (for its usage stats)
    out.requests += float(requests.sum())
    out.in_region_within_slo += total_in_time - forwarded_in_time
    out.forwarded += forwarded
    out.forwarded_within_slo += forwarded_in_time
    out.cold_starts += int(cold.sum())
    used = state.holds.any(axis=1)
    state.last_used[share > 0] = now
    state.freq += per_site * ~before  # the held models' use is counted above
    if record:
        tl = out.timeline
        tl.demand_rps.append((requests.sum(axis=1) / step_s).tolist())
        tl.gpus_in_use.append(int((used & (util > 0)).sum()))
        tl.cold_starts.append(int(cold.sum()))
        tl.forwarded_share.append(forwarded / max(float(requests.sum()), 1.0))
        tl.holders.append(state.holds.sum(axis=0).astype(np.int16))
        tl.cold_by_region.append(cold)
