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
2. Requests are served as `sim.serving` describes: by the region's holders,
   forwarded as the agents route a miss, or loaded on demand at a site of
   the region with the agent's real eviction policy object (GDSF for
   edgeplex, LRU for `lru`) making room; a site's utilisation limits what it
   serves in time.

`lru` is per-site LRU caching with no central placement: the same agents
without placement or forwarding. `hindsight` is no strategy anyone can run:
central placement fed, at each placement, the larger of the synthetic trace's
own rates now and an hour ahead, leaving out only what no forecaster could
know then (bursts not begun, models not launched, a day's factor not drawn);
the forecaster's form with its errors taken away, it shows what a forecast
without errors would earn over `reactive` (bench/sim_at_sizes.py). Nor is
`clairvoyant`: central placement fed, at each placement, the requests the
coming placement period will bring (any trace), noise, bursts and all. Nothing
that places every period can know more, so what it serves over `reactive` is
the most any forecast could earn there. `static` is
what an operator sizing a fixed deployment would run (Triton with a fixed
model list per region): placement once, from each region's peak demand for
each model over the whole trace, and no moves, loads on demand or forwarding
after.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from edgeplex.control_plane.demand import ewma
from edgeplex.control_plane.forecast import Forecaster
from edgeplex.control_plane.placement import (
    CHURN_COST,
    FORWARD_VALUE,
    ModelSpec,
    PlacementInput,
    SiteInfo,
    place,
)
from edgeplex.control_plane.sim.serving import serve_step
from edgeplex.control_plane.sim.spec import Catalog, FleetSpec
from edgeplex.control_plane.sim.traces import DemandSource, SyntheticTrace
from edgeplex.eviction import (
    PLACED_KEPT_OVER_S,
    Candidate,
    EvictionPolicy,
    GreedyDualSizeFrequency,
    LeastRecentlyUsedByCount,
)

STRATEGIES = ("lru", "static", "reactive", "forecast")
HINDSIGHT = "hindsight"  # a forecast without errors, not a strategy (see above)
CLAIRVOYANT = "clairvoyant"  # the next period's own requests known: nor is this
# A miss for a model that placement puts in the miss's region within this many
# minutes counts as placement's lag (`Outcome.placed_late`).
LAG_WINDOW_MIN = 60
TRACE_EPOCH = 4 * 86400.0  # unix time of the trace's minute 0: Monday 1970-01-05 00:00 UTC


@dataclass
class SimConfig:
    step_min: int = 1
    placement_period_min: int = 5
    demand_half_life_s: float = 60.0  # the control plane's default
    forecast_horizon_s: float = 3600.0
    churn_cost: float = CHURN_COST  # the control plane's defaults
    forward_value: float = FORWARD_VALUE
    # A site sees what its region's other sites load on demand (as if routes
    # listed them); off, as the agents run today, a model no site of the region
    # holds is loaded at each site its requests reach (sim.serving).
    siblings_see_loads: bool = True
    # Simulated, not counted: every strategy starts from an empty fleet.
    warmup_min: int = 60
    # Device memory a resident model takes beyond its weights (CUDA context share,
    # ONNX Runtime's arena and workspace); the lower bound charges it too.
    model_overhead_bytes: int = 0
    # A site's first copy of a model is downloaded at this rate (megabits a
    # second) before its promotion; inf: artifacts cost nothing to fetch.
    wan_mbps: float = 1000.0
    # A model not in a site's staged tier (host RAM) is read from its disk and
    # prepared at this rate (megabytes a second) before its promotion; inf: free.
    stage_mbps: float = 1000.0
    # The round trip from a client to a site of its own region; with the queueing
    # delay at the site (serving.py) it counts against the SLO.
    region_rtt_ms: float = 10.0


@dataclass
class Timeline:
    """Per step, for the report's plots."""

    demand_rps: list[list[float]] = field(default_factory=list)  # [step][region]
    gpus_in_use: list[int] = field(default_factory=list)
    cold_starts: list[int] = field(default_factory=list)
    forwarded_share: list[float] = field(default_factory=list)
    holders: list[np.ndarray] = field(default_factory=list)  # [step] -> sites per model
    cold_by_region: list[np.ndarray] = field(default_factory=list)  # [step][region]
    # Requests that found no holder in their region (cold-started or forwarded).
    missed_by_region: list[np.ndarray] = field(default_factory=list)  # [step][region]
    # ... of them, those for a model placement put in their region within the hour
    # after (`_Lag`): what placing it sooner would have served there.
    placed_late_by_region: list[np.ndarray] = field(default_factory=list)  # [step][region]
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
    bytes_downloaded: int = 0  # artifacts fetched to sites that had no copy
    # Requests that found no holder in their region, for a model placement put
    # there within LAG_WINDOW_MIN after: placement's lag behind demand.
    placed_late: float = 0.0
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
            "bytes_downloaded": self.bytes_downloaded,
            "placed_late": self.placed_late / total,
        }


@dataclass
class _Period:
    """One placement period's misses, per (region, model), and where its steps
    are in the timeline."""

    first_row: int
    misses: np.ndarray  # [R, M]
    steps: int = 0


class _Lag:
    """Placement's lag behind demand: the requests that found no holder in their
    region for a model that placement then put there within `window_min`. The
    misses of each placement period in the window are kept per (region, model);
    when a placement puts a model in a region, the misses kept for that pair are
    counted (once), and added to the timeline rows of the steps they came from."""

    def __init__(self, shape: tuple[int, int], period_min: int, window_min: int) -> None:
        self.shape = shape
        self.periods: deque[_Period] = deque(maxlen=max(1, window_min // max(period_min, 1)))
        self.total = 0.0
        self.open(0)

    def open(self, row: int) -> None:
        """A placement period starts, its first step at timeline row `row`."""
        self.periods.append(_Period(row, np.zeros(self.shape)))

    def add(self, missed: np.ndarray) -> None:
        """One step's misses [R, M]."""
        period = self.periods[-1]
        period.steps += 1
        period.misses += missed

    def placed(self, new: np.ndarray, rows: list[np.ndarray] | None) -> None:
        """`new` [R, M]: the models a placement has just put in each region."""
        for p in self.periods:
            per_region = np.where(new, p.misses, 0.0).sum(axis=1)
            p.misses[new] = 0.0
            self.total += float(per_region.sum())
            if rows is not None and p.steps:
                for row in rows[p.first_row : p.first_row + p.steps]:
                    row += per_region / p.steps


class _Fleet:
    """Dense state of one simulated fleet."""

    def __init__(
        self,
        fleet: FleetSpec,
        catalog: Catalog,
        policy: str,
        overhead_bytes: int = 0,
        wan_mbps: float = float("inf"),
        stage_mbps: float = float("inf"),
    ) -> None:
        self.regions = [r.name for r in fleet.regions]
        region_ix = {r: i for i, r in enumerate(self.regions)}
        self.site_ids: list[str] = []
        region: list[int] = []
        memory: list[int] = []
        host: list[int] = []
        concurrency: list[float] = []
        for g in fleet.sites:
            for _ in range(g.count):
                self.site_ids.append(f"{g.region}-{region.count(region_ix[g.region])}")
                region.append(region_ix[g.region])
                memory.append(g.gpu_memory)
                host.append(g.host_memory)
                concurrency.append(g.concurrency)
        self.region = np.array(region, dtype=np.int64)
        self.memory = np.array(memory, dtype=np.float64)
        self.host = np.array(host, dtype=np.float64)
        self.concurrency = np.array(concurrency)
        n_s, n_m, n_r = len(self.site_ids), len(catalog), len(self.regions)
        self.onehot = np.zeros((n_r, n_s))
        self.onehot[self.region, np.arange(n_s)] = 1.0
        self.holds = np.zeros((n_s, n_m), dtype=bool)
        self.placed = np.zeros((n_s, n_m), dtype=bool)  # what placement loads where
        self.moved = np.zeros(n_m, dtype=bool)  # placement changed this hour
        self.cached = np.zeros(n_m, dtype=bool)  # loads on demand changed holders this hour
        self.bytes_loaded = 0
        # Sites that have promoted a model: an agent estimates a staged model's
        # promotion from its own measured ones (none yet: any holder wins).
        self.promoted = np.zeros(n_s, dtype=bool)
        # Sites that have a model's artifact (placed, staged or loaded there once).
        self.installed = np.zeros((n_s, n_m), dtype=bool)
        # The staged tier (host RAM, bounded by `host`): models ready to promote, and
        # when each staged by placement in the background is ready; the site stages
        # one model at a time.
        self.staged = np.zeros((n_s, n_m), dtype=bool)
        self.staged_ready = np.zeros((n_s, n_m))
        self.staging_until = np.zeros(n_s)
        self.wanted = np.zeros((n_s, n_m), dtype=bool)  # placement's staged lists
        self.bytes_downloaded = 0
        self.util = np.zeros(n_s)  # each site's utilisation in the last step
        self.missed = np.zeros((n_r, n_m))  # the last step's requests no region site held
        # Loads take time: when each (site, model) is promoted and serving, and when
        # each site's queue of loads (one at a time) is done.
        self.ready_at = np.zeros((n_s, n_m))
        self.loading_until = np.zeros(n_s)
        self.last_used = np.zeros((n_s, n_m))
        self.freq = np.zeros((n_s, n_m))
        self.credit = np.zeros((n_s, n_m))
        self.size = catalog.size_bytes.astype(np.float64) + overhead_bytes
        # Seconds to download each model's artifact to a site without it.
        self.download_s = catalog.size_bytes * 8.0 / (wan_mbps * 1e6)
        self.stage_s = catalog.size_bytes / (stage_mbps * 1e6)
        self.artifact_bytes = catalog.size_bytes.astype(np.float64)
        self.load_s = catalog.load_s
        # Placed models a load on demand may not evict (eviction.kept_for_plan).
        self.slow_to_promote = self.load_s > PLACED_KEPT_OVER_S
        self.lru = policy == "lru"
        self.rng = np.random.default_rng(0)  # deterministic: the simulator's runs repeat
        self.policies: list[EvictionPolicy] = [
            LeastRecentlyUsedByCount(1 << 30) if policy == "lru" else GreedyDualSizeFrequency()
            for _ in range(n_s)
        ]
        rtt = np.array([[fleet.rtt(a, b) for b in self.regions] for a in self.regions])
        self.rtt = rtt

    def prepare(self, s: int, m: int, at: float) -> float:
        """Seconds before site s can start promoting model m at time `at`: none when
        staged (or until placement's staging of it is done), else reading it from
        disk into the staged tier, downloaded first where the site has no copy.
        It is staged there from then on."""
        if self.staged[s, m]:
            return max(0.0, float(self.staged_ready[s, m]) - at)
        wait = float(self.stage_s[m])
        if not self.installed[s, m]:
            wait += float(self.download_s[m])
            self.installed[s, m] = True
            self.bytes_downloaded += int(self.artifact_bytes[m])
        self.staged[s, m] = True
        self.staged_ready[s, m] = at + wait
        return wait

    def stage(self, s: int, models: list[int], now: float) -> None:
        """Placement's staged list for site s: what the site lacks is downloaded (where
        it has no copy) and staged in the background, one model after another."""
        t = max(now, float(self.staging_until[s]))
        for m in models:
            if not self.staged[s, m]:
                t += self.prepare(s, m, t)
        self.staging_until[s] = t

    def fit_host(self, s: int) -> None:
        """Host RAM: what is on the device stays staged, then what placement stages
        (`wanted`), then the most recently used of the rest."""
        over = float(self.artifact_bytes[self.staged[s]].sum()) - float(self.host[s])
        if over <= 0:
            return
        free = np.nonzero(self.staged[s] & ~self.holds[s])[0]
        for m in free[np.lexsort((self.last_used[s, free], self.wanted[s, free]))]:
            if over <= 0:
                break
            self.staged[s, m] = False
            over -= float(self.artifact_bytes[m])

    def used(self, s: int) -> float:
        return float(self.size[self.holds[s]].sum())

    def room_beside_plan(self, s: int) -> float:
        """Device bytes at site s that what placement loaded there leaves: all an
        agent loads on demand may take (it never evicts a slow placed model for one)."""
        return float(self.memory[s] - self.size[self.kept_for_plan(s) & self.holds[s]].sum())

    def kept_for_plan(self, s: int) -> np.ndarray:
        """[M]: the placed models at site s a load on demand may not evict (their
        promotion is slow: eviction.kept_for_plan)."""
        return self.placed[s] & self.slow_to_promote

    def load_on_demand(self, s: int, wanted: list[int], now: float) -> list[int]:
        """Load `wanted` at site s, making room with the site's policy among the
        models placement did not put there (one decision for the batch, as a burst
        of promotions at an agent); returns what loaded. The caller leaves out what
        is larger than `room_beside_plan`."""
        need = float(self.size[wanted].sum()) - (self.memory[s] - self.used(s))
        if need > 0:
            held = np.nonzero(self.holds[s] & ~self.kept_for_plan(s))[0]
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
            self.promoted[s] = True
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
    peak_rps: np.ndarray | None = None,
    start_min: int = 0,
) -> Outcome:
    """`strategy` over the trace's minutes from `start_min` to `minutes` on `fleet`,
    the fleet empty at `start_min`. The forecaster has learned the trace before
    `start_min` (`learn`), as one kept in Redis would have. `static` places from
    `peak_rps` [region, model] (each one's peak over the trace; found here when not
    given)."""
    config = config or SimConfig()
    if strategy not in (*STRATEGIES, HINDSIGHT, CLAIRVOYANT):
        raise ValueError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    if strategy == HINDSIGHT and not isinstance(trace, SyntheticTrace):
        raise ValueError("hindsight reads the trace's own rates: it needs a synthetic trace")
    state = _Fleet(
        fleet, catalog, "lru" if strategy == "lru" else "gdsf", config.model_overhead_bytes,
        config.wan_mbps, config.stage_mbps,
    )  # fmt: skip
    if minutes - start_min <= config.warmup_min:
        raise ValueError(f"the run must be longer than the warm-up ({config.warmup_min} min)")
    out = Outcome(strategy, gpus=len(state.site_ids), hours=minutes / 60.0)
    central = strategy in ("reactive", "forecast", HINDSIGHT, CLAIRVOYANT)
    specs = tuple(
        ModelSpec(
            name=n,
            size_bytes=int(catalog.size_bytes[j]) + config.model_overhead_bytes,
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
            # Its staged list fills the host RAM its device's models leave.
            host_bytes=max(1, int(state.host[i] - state.memory[i])),
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
    if strategy == "static":  # placed once for the peak, then never moved
        if peak_rps is None:
            peak_rps = peak_rates(trace, minutes, len(state.regions), len(catalog))
        planned = as_demand(peak_rps, state.regions, catalog.names)
        _apply_placement(state, out, sites, specs, planned, latency, config, catalog, TRACE_EPOCH)
    compute_s = catalog.compute_ms / 1000.0
    demand_seen: dict[tuple[str, str], float] = {}
    demand_at = 0.0
    forecaster = Forecaster(recent_half_life_s=config.demand_half_life_s)
    if strategy == "forecast":
        learn(forecaster, trace, start_min, config.placement_period_min, state.regions,
              catalog.names)  # fmt: skip
    period_requests = np.zeros((len(state.regions), len(catalog)))
    period_start = start_min
    step = config.step_min
    counting, hour, placed_at = False, 0, start_min
    rows = out.timeline.placed_late_by_region if record else None
    lag = _Lag(period_requests.shape, config.placement_period_min, LAG_WINDOW_MIN)
    for t in range(start_min, minutes, step):
        now = TRACE_EPOCH + t * 60.0
        if not counting and t >= start_min + config.warmup_min:  # count from here on
            counting = True
            out = Outcome(strategy, gpus=out.gpus, hours=(minutes - t) / 60.0)
            out.timeline.start_min = t
            state.bytes_loaded = state.bytes_downloaded = 0
            state.moved[:] = state.cached[:] = False
            hour = t // 60
            rows = out.timeline.placed_late_by_region if record else None
            lag = _Lag(period_requests.shape, config.placement_period_min, LAG_WINDOW_MIN)
        elif counting and t // 60 != hour:
            hour = t // 60
            out.models_moved += int(state.moved.sum())
            out.models_cached += int(state.cached.sum())
            state.moved[:] = state.cached[:] = False
        if central and (t == start_min or t - placed_at >= config.placement_period_min):
            placed_at = t
            if t > start_min:
                rates = period_requests / ((t - period_start) * 60.0)
                seen = as_demand(rates, state.regions, catalog.names)
                demand_seen = ewma(demand_seen, seen, now - demand_at, config.demand_half_life_s)
                demand_at = now
                forecaster.observe(seen, now)
            if strategy == "forecast":
                planned = forecaster.predict(now, config.forecast_horizon_s)
            elif strategy == HINDSIGHT:
                assert isinstance(trace, SyntheticTrace)  # checked above
                planned = hindsight_demand(
                    trace, t, config.forecast_horizon_s, state.regions, catalog
                )
            elif strategy == CLAIRVOYANT:
                ahead = range(t, t + config.placement_period_min, step)
                counts = np.sum([trace.demand(k, step) for k in ahead], axis=0)
                coming = counts / (len(ahead) * step * 60.0)
                planned = as_demand(coming, state.regions, catalog.names)
            else:
                planned = demand_seen
            in_region = state.onehot @ state.placed > 0
            _apply_placement(state, out, sites, specs, planned, latency, config, catalog, now)
            lag.placed((state.onehot @ state.placed > 0) & ~in_region, rows)
            lag.open(len(rows) if rows is not None else 0)
            period_requests[:] = 0.0
            period_start = t
        requests = trace.demand(t, step)
        period_requests += requests
        serve_step(
            state, out, requests, step, now, central, compute_s, catalog, record,
            config.siblings_see_loads, loads_on_demand=strategy != "static",
            region_rtt_ms=config.region_rtt_ms,
        )  # fmt: skip
        if rows is not None:
            rows.append(np.zeros(len(state.regions)))
        if central:
            lag.add(state.missed)
    out.models_moved += int(state.moved.sum())
    out.models_cached += int(state.cached.sum())
    out.bytes_moved = state.bytes_loaded
    out.bytes_downloaded = state.bytes_downloaded
    out.placed_late = lag.total
    return out


def hindsight_demand(
    trace: SyntheticTrace, minute: int, horizon_s: float, regions: list[str], catalog: Catalog
) -> dict[tuple[str, str], float]:
    """What a forecaster with no errors would predict at `minute`: the larger of
    the trace's rates now and `horizon_s` ahead, as far as they are knowable now."""
    now = trace.rates(minute, known_at=minute)
    ahead = trace.rates(minute + horizon_s / 60.0, known_at=minute)
    return as_demand(np.maximum(now, ahead), regions, catalog.names)


def learn(
    forecaster: Forecaster,
    trace: DemandSource,
    until_min: int,
    period_min: int,
    regions: list[str],
    names: list[str],
) -> None:
    """Feed `forecaster` the trace before `until_min` as the planner would have: each
    placement period's mean rates, observed at its end."""
    for t in range(period_min, until_min + 1, period_min):
        rates = trace.demand(t - period_min, period_min) / (period_min * 60.0)
        forecaster.observe(as_demand(rates, regions, names), TRACE_EPOCH + t * 60.0)


def peak_rates(trace: DemandSource, minutes: int, regions: int, models: int,
               step_min: int = 5) -> np.ndarray:  # fmt: skip
    """Per (region, model), the highest requests/s over any `step_min` of the trace."""
    peak = np.zeros((regions, models))
    for t in range(0, minutes, step_min):
        np.maximum(peak, trace.demand(t, step_min) / (step_min * 60.0), out=peak)
    return peak


def as_demand(
    rates: np.ndarray, regions: list[str], names: list[str]
) -> dict[tuple[str, str], float]:
    """A (region, model) rate array as the planner's demand: requests/s by
    (region name, model name), keys with no demand left out."""
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
            forward_value=config.forward_value,
            search_limit=0,  # greedy only, as the control plane places large fleets
        )
    )
    index = {n: j for j, n in enumerate(names)}
    before, placed_before = state.holds.copy(), state.placed.copy()
    state.placed[:] = False
    wanted = state.wanted
    wanted[:] = False
    for i, sid in enumerate(state.site_ids):
        for name in result.staged.get(sid, ()):
            wanted[i, index[name]] = True
        for name in result.loaded.get(sid, ()):
            state.placed[i, index[name]] = True
    state.holds[:] = state.placed  # agents demote what the desired state does not load
    added = state.holds & ~before
    # Each site loads what placement added one at a time, after the loads it has
    # queued: the artifact's download first where the site has none, its staging
    # where its host RAM has not got it, then the promotion. A model serves from
    # when it is ready (serving.py).
    for site in np.nonzero(added.any(axis=1))[0].tolist():
        ready = max(now, float(state.loading_until[site]))
        for m in np.nonzero(added[site])[0].tolist():
            ready += state.prepare(site, m, ready) + float(catalog.load_s[m])
            state.ready_at[site, m] = ready
        state.loading_until[site] = ready
    # What placement stages is fetched and staged in the background, within host RAM.
    for site in range(len(state.site_ids)):
        state.stage(site, np.nonzero(wanted[site] & ~state.staged[site])[0].tolist(), now)
        state.fit_host(site)
    state.bytes_loaded += int((added * state.size[None, :]).sum())
    state.moved |= np.any(state.placed != placed_before, axis=0)
    for i, j in zip(*np.nonzero(added), strict=True):
        state.promoted[i] = True
        state.last_used[i, j] = now
        state.freq[i, j] = 0.0
        state.credit[i, j] = state.policies[i].stamp()
