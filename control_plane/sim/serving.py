"""One step of the simulated fleet serving its requests (the engine calls it).

Requests from region r for model m go to the sites of r that hold m, split
evenly. With none, the central strategies route each miss as an agent would
(`forward_choice`, the vectorised form of `agent.fleet.routing.choose_route`):
to the nearest region holding m at a site with headroom, unless the round
trip is no faster than promoting m (`load_s`) and the site can estimate that:
a site with m staged that has promoted a model. A region's requests reach its
sites evenly: the sites without an estimate forward their share.
Otherwise m is loaded on demand at the site of r with the most free memory
(of those with an estimate, where a holder was in reach), making room with
the site's eviction policy object after the step's use of what is held is
counted. A site loads one model at a time, placement's loads
and loads on demand in one queue, each downloading the artifact first where
the site has none: a model's requests at a site miss the SLO until the loads
before it and its own are done. A site's utilisation is the compute of what
it serves over its concurrency. Below 1, a request meets the SLO when the
round trip to its site, its wait in the site's queue and its compute fit:
the wait is an M/M/c queue's (Erlang C; c the site's concurrency, the
service time the mean compute of what the site serves). At 1 and above, the
site serves only 1/utilisation of its requests in time.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgeplex.control_plane.sim.engine import Outcome, _Fleet
    from edgeplex.control_plane.sim.spec import Catalog


def forward_choice(
    holders_free: np.ndarray,
    rtt_ms: np.ndarray,
    promote_ms: np.ndarray,
    known: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """For each miss: whether it is forwarded, and to which region.

    `holders_free` [miss, region]: the region holds the model at a site with
    headroom; `rtt_ms` [miss, region]: round trip from the miss's region (inf:
    no route); `promote_ms` [miss]: the model's promotion time, which the
    agent estimates once it has measured promotions (`known`). The agent's
    rule: the nearest peer with headroom, unless promoting here is estimated
    to be no slower than the round trip."""
    nearest, nearest_ms = _nearest(holders_free, rtt_ms)
    local_wins = known & (nearest_ms >= promote_ms)
    return np.isfinite(nearest_ms) & ~local_wins, nearest


def _nearest(holders_free: np.ndarray, rtt_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each miss, the nearest region holding its model at a site with headroom,
    and its round trip (inf: none in reach)."""
    distance = np.where(holders_free, rtt_ms, np.inf)
    nearest = distance.argmin(axis=1)
    return nearest, distance[np.arange(len(nearest)), nearest]


def serve_step(
    state: _Fleet,
    out: Outcome,
    requests: np.ndarray,
    step: int,
    now: float,
    central: bool,
    compute_s: np.ndarray,
    catalog: Catalog,
    record: bool,
    siblings_see_loads: bool = True,
    loads_on_demand: bool = True,
    region_rtt_ms: float = 0.0,
) -> None:
    n_r = len(state.regions)
    step_s = step * 60.0
    holders = state.onehot @ state.holds  # [R, M] sites holding m in region r
    wanted = requests > 0
    served_at = np.where(holders > 0, requests, 0.0)  # [R(serving), M] requests
    cold = np.zeros(n_r, dtype=np.int64)
    forwarded_at = np.zeros_like(served_at)  # the part of served_at that was forwarded
    forwarded_late = np.zeros_like(served_at)  # ... whose round trip misses the SLO
    state.missed = np.where(holders == 0, requests, 0.0)  # [R, M], for the engine's lag
    missed = state.missed.sum(axis=1)
    rs, ms = np.nonzero(wanted & (holders == 0))
    local = requests.copy()  # the requests a region's own sites serve or load for
    only: dict[tuple[int, int], np.ndarray] = {}  # (region, model) -> the sites that load it
    if central and rs.size:  # route each miss as its agent would
        with_headroom = state.onehot @ (state.holds & (state.util < 1.0)[:, None])
        nearest, nearest_ms = _nearest(with_headroom[:, ms].T > 0, state.rtt[rs])
        reach = np.isfinite(nearest_ms)
        always = reach & (nearest_ms < catalog.load_s[ms] * 1000.0)  # the round trip wins
        # A site estimates a promotion only of a model staged there, once it has
        # promoted one; the rest forward to any holder (forward_choice, per site).
        # A region's requests reach its sites evenly, so the share forwarded is the
        # share of sites without an estimate (all of them where the round trip wins).
        estimates = state.staged & (state.staged_ready <= now) & state.promoted[:, None]
        in_region = np.maximum(state.onehot[rs].sum(axis=1), 1.0)  # a region may have none
        known = (state.onehot @ estimates)[rs, ms] / in_region
        share = np.where(always, 1.0, np.where(reach, 1.0 - known, 0.0))
        sent = share > 0
        to, m_sent = nearest[sent], ms[sent]
        n_sent = requests[rs[sent], m_sent] * share[sent]
        np.add.at(served_at, (to, m_sent), n_sent)
        np.add.at(forwarded_at, (to, m_sent), n_sent)
        local[rs[sent], m_sent] -= n_sent
        in_slo = state.rtt[rs[sent], to] + catalog.compute_ms[m_sent] <= catalog.slo_ms[m_sent]
        np.add.at(forwarded_late, (to[~in_slo], m_sent[~in_slo]), n_sent[~in_slo])
        for k in np.nonzero(sent & (share < 1.0))[0].tolist():  # the sites that load it
            r, m = int(rs[k]), int(ms[k])
            only[r, m] = np.nonzero(estimates[:, m] & (state.region == r))[0]
        rs, ms = rs[share < 1.0], ms[share < 1.0]
    misses: dict[int, list[int]] = {}  # region -> models it must load
    for r, m in zip(rs.tolist(), ms.tolist(), strict=True) if loads_on_demand else ():
        misses.setdefault(r, []).append(m)
    # The models held at the step's start serve it, and are credited with that
    # use before its loads on demand choose victims (an agent sees each request
    # as it comes; a step that counted use after its evictions made the models
    # placement had just loaded, with no use yet, the cheapest victims).
    before = state.holds.copy()
    cycled = np.zeros_like(before)
    first_loads = np.zeros(len(state.site_ids))
    busy_s = np.zeros(len(state.site_ids))  # each site's time spent loading this step
    first = before * np.where(holders > 0, served_at / np.maximum(holders, 1), 0.0)[state.region]
    state.freq += first
    state.last_used[first > 0] = now
    # Cold starts, at the sites with the most free memory: one a model, or with
    # `siblings_see_loads` off (routes list placement's holders only, as the
    # agents' do), each site a missing model's requests reach loads it: of n
    # sites, n(1 - (1 - 1/n)^requests) in expectation (rounded at random).
    for r, models in misses.items():
        members = np.nonzero(state.region == r)[0]
        if members.size == 0:
            continue  # no site in the region: every request misses
        used = (state.holds[members] * state.size).sum(axis=1)
        free = dict(zip(members.tolist(), (state.memory[members] - used).tolist(), strict=True))
        batches: dict[int, list[int]] = {}
        first_ready: dict[int, float] = {}
        for m in sorted(models, key=lambda j: -local[r, j]):
            sites = only.get((r, m), members).tolist()  # those that promote it, not forward
            reached = 1
            n = len(sites)
            if not siblings_see_loads and n > 1:  # the sites n requests reach, in expectation
                expected = n * -math.expm1(max(1.0, local[r, m]) * math.log1p(-1.0 / n))
                reached = int(expected) + int(state.rng.random() < expected % 1.0)
                reached = min(n, max(1, reached))
            for i in heapq.nlargest(reached, sites, key=free.__getitem__):  # most room first
                batches.setdefault(i, []).append(m)
                free[i] -= float(state.size[m])
        for i, batch in batches.items():
            # An agent refuses a load that only evicting placed models could make
            # room for: its requests miss (planner.plan_room).
            room = state.room_beside_plan(i)
            batch = [m for m in batch if state.size[m] <= room]
            if not batch:
                continue
            # A site loads one model at a time (the agent's runner creates
            # sessions one after another): each waits for the loads before it.
            # What does not fit beside the rest is loaded in turn, evicting
            # (`cycled`: served this step, not held at its end).
            ready_s = max(0.0, float(state.loading_until[i]) - now)  # loads queued there
            loaded = state.load_on_demand(i, batch, now)
            for m in loaded + [m for m in batch if m not in loaded]:
                ready_s += state.prepare(i, m, now + ready_s) + catalog.load_s[m]
                cold[r] += 1
                first_loads[i] += 1
                cycled[i, m] = not state.holds[i, m]
                first_ready[m] = min(first_ready.get(m, np.inf), ready_s)
                state.ready_at[i, m] = now + ready_s
            busy_s[i] = min(ready_s, step_s)
            state.loading_until[i] = now + ready_s
            state.fit_host(i)
        for m, ready_s in first_ready.items():  # served from the first site ready
            served_at[r, m] += local[r, m] * (1.0 - min(1.0, ready_s / step_s))
            holders[r, m] += 1
    # Spread what each region serves over its holders, a victim of this step's
    # loads included (it served until then); utilisation per site.
    serving = before | state.holds | cycled
    holders = state.onehot @ serving
    spread = np.maximum(holders, 1)
    per_site = serving * np.where(holders > 0, served_at / spread, 0.0)[state.region]
    per_site_fwd = serving * (forwarded_at / spread)[state.region]
    per_site_late = serving * (forwarded_late / spread)[state.region]
    reloads, late = _thrash(state, per_site, first_loads, busy_s, step_s, catalog)
    # What placement loaded is held from its step, but serves only once ready.
    pending = np.clip((state.ready_at - now) / step_s, 0.0, 1.0) * before
    late = np.minimum(per_site, late + per_site * pending)
    cold += (state.onehot @ reloads).round().astype(np.int64)
    util = (per_site * compute_s[None, :]).sum(axis=1) / (state.concurrency * step_s)
    state.util = util  # what the next step's routes report as headroom
    within = within_slo(util, state.concurrency, per_site, compute_s, catalog, region_rtt_ms)
    # The share of each site's requests for each model not waiting on a load, the
    # same for the forwarded ones among them.
    on_time = within * (1.0 - late / np.maximum(per_site, 1e-12))
    total_in_time = float((per_site * on_time).sum())
    forwarded_in_time = float((per_site_fwd * on_time).sum())
    late_in_time = float((per_site_late * on_time).sum())
    forwarded = float(forwarded_at.sum())
    share = per_site  # what each site served of each model (for its usage stats)
    out.requests += float(requests.sum())
    out.in_region_within_slo += total_in_time - forwarded_in_time
    out.forwarded += forwarded
    out.forwarded_within_slo += forwarded_in_time - late_in_time
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
        tl.missed_by_region.append(missed)


def within_slo(
    util: np.ndarray,
    concurrency: np.ndarray,
    per_site: np.ndarray,
    compute_s: np.ndarray,
    catalog: Catalog,
    rtt_ms: float,
) -> np.ndarray:
    """[S, M]: the share of model m's requests at site s answered within its SLO.
    Below full utilisation, an M/M/c queue's (Erlang C): a request waits with
    probability C, and then longer than t with probability C exp(-(c/s - l) t)
    (c servers, mean service time s, arrival rate l); it meets the SLO if the round
    trip, the wait and its compute fit. At and above 1: 1/utilisation."""
    c = np.maximum(1, np.round(concurrency)).astype(np.int64)
    offered = util * c  # Erlangs
    erlang_b = np.ones_like(util)
    for k in range(1, int(c.max(initial=1)) + 1):  # B(k) from B(k-1), stable
        step = offered * erlang_b / (k + offered * erlang_b)
        erlang_b = np.where(k <= c, step, erlang_b)
    busy = util < 1.0
    waits = np.where(busy, erlang_b / np.maximum(1e-12, 1.0 - util * (1.0 - erlang_b)), 1.0)
    served = per_site.sum(axis=1)
    mean_s = (per_site * compute_s[None, :]).sum(axis=1) / np.maximum(served, 1e-12)
    drain = np.where(mean_s > 0, (c - offered) / np.maximum(mean_s, 1e-12), np.inf)  # per s
    slack_s = (catalog.slo_ms - catalog.compute_ms - rtt_ms) / 1000.0  # [M]
    late = waits[:, None] * np.exp(-np.outer(drain, np.maximum(slack_s, 0.0)))
    ok = np.where(busy[:, None], 1.0 - late, 1.0 / np.maximum(util, 1e-12)[:, None])
    return np.clip(ok, 0.0, 1.0) * (slack_s >= 0)[None, :]


def _thrash(
    state: _Fleet,
    per_site: np.ndarray,
    first_loads: np.ndarray,
    busy_s: np.ndarray,
    step_s: float,
    catalog: Catalog,
) -> tuple[np.ndarray, np.ndarray]:
    """Loads beyond each model's first, at sites whose step asks for more models
    than they hold: requests interleave, and each evicts what the next needs.
    A site loads one model at a time, so what its step has no time left to load
    is late. Returns the extra loads per site [S] and the requests they make
    late [S, M] (a request waits for its model's promotion)."""
    reloads = np.zeros(len(state.site_ids))
    late = np.zeros_like(per_site)
    asked = per_site > 1e-9
    over = np.nonzero((asked * state.size).sum(axis=1) > state.memory)[0]
    if over.size == 0:
        return reloads, late
    q = per_site[over]  # [O, M]
    mean_size = (asked[over] * state.size).sum(axis=1) / asked[over].sum(axis=1)
    room = np.maximum(1.0, state.memory[over] // mean_size) * mean_size  # whole models
    misses = (lru_misses if state.lru else frequency_misses)(q, state.size, room)
    extra = np.maximum(0.0, misses.sum(axis=1) - first_loads[over])
    share = misses / np.maximum(misses.sum(axis=1, keepdims=True), 1e-12)
    load_s = (share * catalog.load_s).sum(axis=1)  # the mean load among the misses
    time_for = np.maximum(0.0, step_s - busy_s[over]) / np.maximum(load_s, 1e-9)
    done = np.minimum(extra, time_for)
    reloads[over] = done
    state.bytes_loaded += int((share * state.size).sum(axis=1) @ done)
    waits_too_long = catalog.load_s * 1000.0 + catalog.compute_ms > catalog.slo_ms
    late_rows = share * done[:, None] * waits_too_long + share * (extra - done)[:, None]
    late[over] = np.minimum(late_rows, q)
    return reloads, late


def lru_misses(q: np.ndarray, size: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Expected misses per (site, model) under LRU (Che's approximation): a model
    with q requests in the step misses with probability exp(-q T), T per site
    such that the expected bytes held fill its `room`."""
    lo, hi = np.full(len(q), 1e-9), np.full(len(q), 1e9)
    for _ in range(40):  # the bytes held grow with T: bisect in log
        t = np.sqrt(lo * hi)
        short = (-np.expm1(-q * t[:, None]) * size).sum(axis=1) < room
        lo, hi = np.where(short, t, lo), np.where(short, hi, t)
    return q * np.exp(-q * t[:, None])


def frequency_misses(q: np.ndarray, size: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Expected misses per (site, model) under a frequency-weighted policy (GDSF
    with equal costs is LFU with ageing): the most requested models keep their
    room, and the rest take turns in one model's room, each missing unless the
    request before it there was its own."""
    order = np.argsort(-q, axis=1, kind="stable")
    sizes = np.where(np.take_along_axis(q, order, axis=1) > 0, size[order], 0.0)
    mean = sizes.sum(axis=1) / np.maximum((sizes > 0).sum(axis=1), 1)
    kept_sorted = np.cumsum(sizes, axis=1) <= (room - mean)[:, None]
    kept = np.zeros_like(kept_sorted)
    np.put_along_axis(kept, order, kept_sorted, axis=1)
    rest = np.where(kept, 0.0, q)
    total = rest.sum(axis=1, keepdims=True)
    return rest * (1.0 - rest / np.maximum(total, 1e-12))
