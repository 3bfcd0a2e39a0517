"""Demand traces for the simulator: rows of (minute, region, model, requests).

Three sources, one interface (`demand(minute, minutes) -> [regions, models]`
requests in that window):

- `SyntheticTrace`, the generator, with these knobs (`TraceKnobs`):
  - `zipf`: popularity exponent over the catalog (1.0); each region keeps the
    global order for its head (`shared_head`, 10% of models) and shuffles the
    tail, so regions agree on what is hot and differ on the long tail;
  - `peak_rps`: the fleet-wide peak of requests per second (20,000), reached
    once a week at the busiest minute (bursts come on top);
  - a diurnal cycle per region in its own time zone: `night_floor` (0.2) of
    the peak at 04:00 local, rising to the peak at 16:00;
  - each model's own phase: its day peaks `model_phase_h` hours (4, the
    spread of a normal draw per model) earlier or later than the region's, as
    apps do (a news model in the morning, a game model at night), so what is
    hot in a region changes through its day;
  - a weekly cycle: local Saturdays and Sundays at `weekend` (0.7);
  - `bursts_per_day` (4): a random model of the top 200 in a random region
    runs 5-20x its rate for 15-60 minutes;
  - `launch_share` / `retire_share` (0.05 each): that share of models appears
    (or disappears) at a random minute of the trace;
  - days that differ, so no day repeats the last: each model's rate on each
    day times a lognormal factor of mean 1 (`day_sigma`, 0.3); each model's
    trend, drawn once, uniform within ±`weekly_trend` (0.2) a week; and
    `daily_burst_share` (0.05) of the models, drawn once, each with one
    unannounced burst a day of `daily_burst_factor` (10x) for an hour, at a
    random minute in one random region. The day factor changes at midnight
    UTC everywhere, or, with `local_days`, at each region's own midnight.
  Request counts are Poisson draws around the rates, from a generator seeded
  by (seed, minute): the same seed gives the same trace.
- `TraceFile`: a CSV (`minute,region,model,requests`, with that header) or
  Parquet file with those columns.
- `read_azure_functions`: the per-minute invocation counts of the public Azure
  Functions traces (`HashOwner,HashApp,HashFunction,Trigger,1,...,1440`, one
  file per day). Each function becomes a model `fn-<first 12 hex of its
  hash>`, and each owner is assigned to a region by its hash, so an owner's
  functions share a region.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edgeplex.control_plane.sim.spec import Catalog, FleetSpec

MINUTES_PER_DAY = 1440
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY


class DemandSource(Protocol):
    minutes: int

    def demand(self, minute: int, minutes: int) -> np.ndarray:
        """Requests per [region, model] in minutes [minute, minute + minutes)."""
        ...


@dataclass(frozen=True)
class TraceKnobs:
    zipf: float = 1.0
    shared_head: float = 0.1
    peak_rps: float = 20_000.0
    night_floor: float = 0.2
    peak_hour: float = 16.0
    weekend: float = 0.7
    model_phase_h: float = 4.0
    bursts_per_day: float = 4.0
    launch_share: float = 0.05
    retire_share: float = 0.05
    day_sigma: float = 0.3
    weekly_trend: float = 0.2
    daily_burst_share: float = 0.05
    daily_burst_factor: float = 10.0
    local_days: bool = False


class SyntheticTrace:
    def __init__(
        self, fleet: FleetSpec, catalog: Catalog, days: float, knobs: TraceKnobs, seed: int
    ) -> None:
        self.knobs = knobs
        self.seed = seed
        self.minutes = int(days * MINUTES_PER_DAY)
        rng = np.random.default_rng(seed)
        n_r, n_m = len(fleet.regions), len(catalog)
        self.offsets_h = np.array([r.utc_offset_h for r in fleet.regions])
        sites = np.array(list(fleet.per_region().values()), dtype=float)
        self.region_weight = sites / sites.sum() if sites.sum() else np.full(n_r, 1 / n_r)
        # Popularity: a shared head in global order, a shuffled tail per region.
        base = 1.0 / np.arange(1, n_m + 1) ** knobs.zipf
        order = rng.permutation(n_m)  # the catalog's global popularity order
        self.phase_h = (
            rng.normal(0.0, knobs.model_phase_h, n_m) if knobs.model_phase_h else np.zeros(n_m)
        )
        head = max(1, int(n_m * knobs.shared_head))
        self.popularity = np.zeros((n_r, n_m))
        for r in range(n_r):
            ranked = np.concatenate([order[:head], rng.permutation(order[head:])])
            self.popularity[r, ranked] = base
            self.popularity[r] /= self.popularity[r].sum()
        total_minutes = max(self.minutes, 1)
        self.launch = np.zeros(n_m)
        self.retire = np.full(n_m, np.inf)
        launching = rng.random(n_m) < knobs.launch_share
        self.launch[launching] = rng.uniform(0, total_minutes, launching.sum())
        retiring = (rng.random(n_m) < knobs.retire_share) & ~launching
        self.retire[retiring] = rng.uniform(0, total_minutes, retiring.sum())
        n_bursts = rng.poisson(knobs.bursts_per_day * max(days, 0))
        self.bursts = [
            (
                int(rng.integers(n_r)),
                int(order[rng.integers(min(200, n_m))]),
                float(rng.uniform(0, total_minutes)),
                float(rng.uniform(15, 60)),
                float(rng.uniform(5, 20)),
            )
            for _ in range(n_bursts)
        ]
        self.trend = rng.uniform(-knobs.weekly_trend, knobs.weekly_trend, n_m)
        self.bursty = np.nonzero(rng.random(n_m) < knobs.daily_burst_share)[0]
        self._days: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        week = np.arange(MINUTES_PER_WEEK, dtype=float)
        fleet_rate = sum(
            self.region_weight[r] * self._shape(week, r) for r in range(n_r)
        )  # requests/s per unit scale, summed over models (popularity sums to 1)
        self.scale = knobs.peak_rps / float(np.max(fleet_rate))

    def _shape(
        self, minute: np.ndarray | float, r: int, phase_h: np.ndarray | float = 0.0
    ) -> np.ndarray:
        """Diurnal times weekly factor of region r at UTC minutes `minute` (shifted
        by `phase_h` hours: one value, or one per model)."""
        k = self.knobs
        local_h = minute / 60.0 + self.offsets_h[r] - phase_h
        phase = 2 * math.pi * (local_h - (k.peak_hour - 12.0)) / 24.0
        diurnal = k.night_floor + (1 - k.night_floor) * (0.5 - 0.5 * np.cos(phase))
        # The trace starts on a Monday 00:00 UTC; days 5 and 6 are the weekend.
        local_day = np.floor(local_h / 24.0) % 7
        weekly = np.where(local_day >= 5, k.weekend, 1.0)
        return diurnal * weekly

    def rates(self, minute: float, known_at: float | None = None) -> np.ndarray:
        """Requests per second [regions, models] at UTC `minute` of the trace; or, with
        `known_at`, what could be known of them at that minute: bursts not begun by
        then, models not launched by then and a day's factor not drawn by then
        (`known_at`'s day's stands in) are left out. The simulator's hindsight
        forecast (a forecast without errors) reads this."""
        known = minute if known_at is None else min(minute, known_at)
        n_r = len(self.region_weight)
        shape = np.array([self._shape(np.float64(minute), r, self.phase_h) for r in range(n_r)])
        rate = self.scale * self.region_weight[:, None] * shape * self.popularity
        alive = (self.launch <= known) & (minute < self.retire)
        rate *= alive[None, :]
        for r, m, start, length, factor in self.bursts:
            if start <= known and minute < start + length:
                rate[r, m] *= factor
        trend = np.maximum(0.05, 1.0 + self.trend * minute / MINUTES_PER_WEEK)
        # Each region's day factor: of the UTC day, or of its own (`local_days`); the
        # evening before the trace's first local day takes that day's.
        shift = self.offsets_h * 60.0 if self.knobs.local_days else np.zeros(n_r)
        for r, day in enumerate(np.maximum((known + shift) // MINUTES_PER_DAY, 0)):
            rate[r] *= self._day(int(day))[0] * trend
        known_day = int(known // MINUTES_PER_DAY)
        if int(minute // MINUTES_PER_DAY) == known_day:  # the daily bursts begun by `known`
            _, burst_region, burst_start = self._day(known_day)
            at = minute % MINUTES_PER_DAY
            on = (burst_start <= known % MINUTES_PER_DAY) & (at < burst_start + 60)
            if on.any():
                rate[burst_region[on], self.bursty[on]] *= self.knobs.daily_burst_factor
        return rate

    def _day(self, day: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Day `day`'s factor per model (lognormal, mean 1), and the region and the
        minute of the day of each bursty model's burst; drawn from (seed, day)."""
        found = self._days.get(day)
        if found is None:
            k, n_m, n_r = self.knobs, self.popularity.shape[1], self.popularity.shape[0]
            rng = np.random.default_rng([self.seed, 7, day])
            noise = np.exp(rng.normal(-(k.day_sigma**2) / 2, k.day_sigma, n_m))
            regions = rng.integers(n_r, size=len(self.bursty))
            starts = rng.uniform(0, MINUTES_PER_DAY - 60, len(self.bursty))
            found = self._days[day] = (noise, regions, starts)
        return found

    def demand(self, minute: int, minutes: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, minute, minutes])
        mean = self.rates(minute + minutes / 2.0) * 60.0 * minutes
        return rng.poisson(mean).astype(np.float64)

    def rows(self) -> Iterator[tuple[int, int, int, int]]:
        """(minute, region index, model index, requests) of every non-zero minute."""
        for minute in range(self.minutes):
            counts = self.demand(minute, 1)
            for r, m in zip(*np.nonzero(counts), strict=True):
                yield minute, int(r), int(m), int(counts[r, m])


class TraceFile:
    """A trace read from rows; regions and models resolved against the fleet and
    the catalog (an unknown name is an error that names it)."""

    def __init__(
        self, rows: Iterable[tuple[int, str, str, float]], fleet: FleetSpec, catalog: Catalog
    ) -> None:
        region_ix = {r.name: i for i, r in enumerate(fleet.regions)}
        model_ix = {n: i for i, n in enumerate(catalog.names)}
        minute, reg, mod, count = [], [], [], []
        for t, region, model, requests in rows:
            if region not in region_ix:
                raise ValueError(f"trace: region {region!r} is not in the fleet")
            if model not in model_ix:
                raise ValueError(f"trace: model {model!r} is not in the catalog")
            minute.append(int(t))
            reg.append(region_ix[region])
            mod.append(model_ix[model])
            count.append(float(requests))
        order = np.argsort(np.array(minute, dtype=np.int64), kind="stable")
        self._minute = np.array(minute, dtype=np.int64)[order]
        self._region = np.array(reg, dtype=np.int64)[order]
        self._model = np.array(mod, dtype=np.int64)[order]
        self._count = np.array(count)[order]
        self._shape = (len(fleet.regions), len(catalog))
        self.minutes = int(self._minute.max()) + 1 if self._minute.size else 0

    def demand(self, minute: int, minutes: int) -> np.ndarray:
        lo, hi = np.searchsorted(self._minute, [minute, minute + minutes])
        out = np.zeros(self._shape)
        np.add.at(out, (self._region[lo:hi], self._model[lo:hi]), self._count[lo:hi])
        return out


def read_rows(path: Path) -> Iterator[tuple[int, str, str, float]]:
    """Rows of a CSV or Parquet trace file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # the `sim` extra

        table = pq.read_table(path, columns=["minute", "region", "model", "requests"])
        cols = table.to_pydict()
        yield from zip(cols["minute"], cols["region"], cols["model"], cols["requests"], strict=True)
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"minute", "region", "model", "requests"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for row in reader:
            yield int(row["minute"]), row["region"], row["model"], float(row["requests"])


def write_csv(path: Path, rows: Iterable[tuple[int, str, str, float]]) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["minute", "region", "model", "requests"])
        out.writerows(rows)


def read_azure_functions(
    paths: list[Path], regions: list[str], first_day: int = 0
) -> Iterator[tuple[int, str, str, float]]:
    """Rows from Azure Functions invocation files, one per day in `paths` order."""
    for day, path in enumerate(paths, start=first_day):
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            if header[:4] != ["HashOwner", "HashApp", "HashFunction", "Trigger"]:
                raise ValueError(f"{path}: not the Azure Functions invocation layout")
            minute_cols = [(i, int(h)) for i, h in enumerate(header) if h.isdigit()]
            for row in reader:
                owner, function = row[0], row[2]
                pick = int(hashlib.sha256(owner.encode()).hexdigest(), 16) % len(regions)
                model = f"fn-{function[:12]}"
                for i, minute in minute_cols:
                    if row[i] and row[i] != "0":
                        yield (
                            day * MINUTES_PER_DAY + minute - 1,
                            regions[pick],
                            model,
                            float(row[i]),
                        )
