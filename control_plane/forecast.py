"""Demand one placement horizon ahead, per (region, model): seasonal by hour of
day and day of week, scaled to how today runs, following bursts. Pure numpy; no
hidden clock.

`observe(demand, now)` folds one observation (requests/s per (region, model),
at unix time `now`) into these, per key:

- the recent level: an exponentially weighted mean with half-life
  `recent_half_life_s` (what reactive placement uses alone);
- an hour-of-day profile: per hour, an exponentially weighted mean over days
  (weight `day_weight` for each new day's value);
- an hour-of-week profile, the same over weeks, used for a bucket once it has
  been seen at least once (before that, the hour-of-day profile stands in);
- today's level against the profile: two exponentially weighted means with
  half-life `level_half_life_s` (an hour), one of what was observed and one of
  what the profile said for the same moments. Their ratio is how today runs
  against the season (a model's day above or below its usual, a trend); taken
  over the last hour or so, not one observation, it does not carry one
  period's noise into the forecast.

`predict(now, horizon_s)` is, per key, the larger of the profile's value now
and at `now + horizon_s`, times today's ratio (clipped to [0.5, 2]): follow-
the-sun moves happen before a region's peak, and nothing is dropped before its
hour is over. Where the recent level runs above `burst_factor` (1.5) times
that, the key is in a burst no season foretells, and the forecast is the
recent level; so it is for a key with no season yet. Placing from the
forecast rather than the larger of it and the recent level keeps one
period's noise out of placement: over the standard trace that moves fewer
models an hour and cuts the misses placement is late for (docs/simulator.md).

The control plane's planner feeds it every round and places from
`predict(now, forecast_horizon_s)`; the simulator (control_plane/sim/) runs
the same object. `to_bytes`/`from_bytes` keep it in Redis (raw float32 arrays,
bit masks and JSON keys; no pickle), so a new leader keeps what the last one
learned.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

Demand = dict[tuple[str, str], float]

HOURS_PER_DAY = 24
HOURS_PER_WEEK = 168
_HEADER = struct.Struct("<I")


class Forecaster:
    def __init__(
        self,
        recent_half_life_s: float = 300.0,
        day_weight: float = 0.5,
        level_half_life_s: float = 3600.0,
        burst_factor: float = 1.5,
    ) -> None:
        self.recent_half_life_s = recent_half_life_s
        self.day_weight = day_weight
        self.level_half_life_s = level_half_life_s
        self.burst_factor = burst_factor
        self.keys: list[tuple[str, str]] = []
        self._ix: dict[tuple[str, str], int] = {}
        self.recent = np.zeros(0)
        # Today's level: what was observed, and what the profile said then.
        self.level_seen = np.zeros(0)
        self.level_expected = np.zeros(0)
        self.by_hour = np.zeros((0, HOURS_PER_DAY))
        self.by_week_hour = np.zeros((0, HOURS_PER_WEEK))
        self.seen_hour = np.zeros((0, HOURS_PER_DAY), dtype=bool)
        self.seen_week_hour = np.zeros((0, HOURS_PER_WEEK), dtype=bool)
        self._last: float | None = None
        # The bucket being filled, and the mean of its observations so far.
        self._bucket: int | None = None
        self._bucket_sum = np.zeros(0)
        self._bucket_n = 0

    # --- learning -------------------------------------------------------------------------

    def _index(self, demand: Demand) -> np.ndarray:
        new = [k for k in demand if k not in self._ix]
        if new:
            for k in new:
                self._ix[k] = len(self.keys)
                self.keys.append(k)
            grow = len(new)
            self.recent = np.concatenate([self.recent, np.zeros(grow)])
            self.level_seen = np.concatenate([self.level_seen, np.zeros(grow)])
            self.level_expected = np.concatenate([self.level_expected, np.zeros(grow)])
            self.by_hour = np.vstack([self.by_hour, np.zeros((grow, HOURS_PER_DAY))])
            self.by_week_hour = np.vstack([self.by_week_hour, np.zeros((grow, HOURS_PER_WEEK))])
            self.seen_hour = np.vstack(
                [self.seen_hour, np.zeros((grow, HOURS_PER_DAY), dtype=bool)]
            )
            self.seen_week_hour = np.vstack(
                [self.seen_week_hour, np.zeros((grow, HOURS_PER_WEEK), dtype=bool)]
            )
            self._bucket_sum = np.concatenate([self._bucket_sum, np.zeros(grow)])
        values = np.zeros(len(self.keys))
        for k, v in demand.items():
            values[self._ix[k]] = v
        return values

    def observe(self, demand: Demand, now: float) -> bool:
        """Fold in one observation; True when it closed an hour (the profiles moved)."""
        values = self._index(demand)
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        alpha = (
            1.0
            if dt == 0.0 and not self.recent.any()
            else 1.0 - 0.5 ** (dt / self.recent_half_life_s)
        )
        self.recent += alpha * (values - self.recent)
        bucket = week_hour(now)
        closed = self._bucket is not None and bucket != self._bucket
        if closed:
            self._close_bucket()
        self._bucket = bucket
        self._bucket_sum += values
        self._bucket_n += 1
        here, known = self._seasonal(bucket)
        expected = np.where(known, here, values)
        beta = 1.0 if dt == 0.0 else 1.0 - 0.5 ** (dt / self.level_half_life_s)
        self.level_seen += beta * (values - self.level_seen)
        self.level_expected += beta * (expected - self.level_expected)
        return closed

    def _close_bucket(self) -> None:
        """Fold the finished hour's mean into both profiles."""
        assert self._bucket is not None
        mean = self._bucket_sum / max(1, self._bucket_n)
        for profile, seen, b in (
            (self.by_hour, self.seen_hour, self._bucket % HOURS_PER_DAY),
            (self.by_week_hour, self.seen_week_hour, self._bucket),
        ):
            old = profile[:, b]
            profile[:, b] = np.where(seen[:, b], old + self.day_weight * (mean - old), mean)
            seen[:, b] = True
        self._bucket_sum = np.zeros(len(self.keys))
        self._bucket_n = 0

    # --- predicting -----------------------------------------------------------------------

    def _seasonal(self, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """The profile's value at `bucket` and whether there is one, per key."""
        week = self.seen_week_hour[:, bucket]
        day = self.seen_hour[:, bucket % HOURS_PER_DAY]
        value = np.where(week, self.by_week_hour[:, bucket], self.by_hour[:, bucket % 24])
        return value, week | day

    def predict_array(self, now: float, horizon_s: float) -> np.ndarray:
        here, known_here = self._seasonal(week_hour(now))
        ahead, known_ahead = self._seasonal(week_hour(now + horizon_s))
        ratio = np.where(
            self.level_expected > 1e-9,
            self.level_seen / np.maximum(self.level_expected, 1e-9),
            1.0,
        )
        ratio = np.clip(ratio, 0.5, 2.0)
        seasonal = np.where(known_here, np.maximum(here, ahead), ahead) * ratio
        seasonal = np.where(known_ahead, seasonal, self.recent)
        return np.where(self.recent > self.burst_factor * seasonal, self.recent, seasonal)

    def __contains__(self, key: tuple[str, str]) -> bool:
        """Whether the forecaster has seen `key` (its forecast stands for it)."""
        return key in self._ix

    def predict(self, now: float, horizon_s: float) -> Demand:
        values = self.predict_array(now, horizon_s)
        return {k: float(v) for k, v in zip(self.keys, values, strict=True) if v >= 1e-3}

    def observed(self) -> Demand:
        return {k: float(v) for k, v in zip(self.keys, self.recent, strict=True) if v >= 1e-3}

    # --- persistence (Redis) -------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The state, compact: the profiles as float32 (a rate's seventh digit is
        noise), the seen-masks as bits; about 0.8 KB a key."""
        meta = json.dumps(
            {
                "format": 3,
                "keys": [list(k) for k in self.keys],
                "last": self._last,
                "bucket": self._bucket,
                "bucket_n": self._bucket_n,
            }
        ).encode()
        rates = [
            self.recent, self.by_hour, self.by_week_hour, self._bucket_sum,
            self.level_seen, self.level_expected,
        ]  # fmt: skip
        seen = np.hstack([self.seen_hour, self.seen_week_hour])
        return (
            _HEADER.pack(len(meta))
            + meta
            + b"".join(a.astype("<f4").tobytes() for a in rates)
            + np.packbits(seen, axis=1).tobytes()
        )

    @classmethod
    def from_bytes(cls, data: bytes, **kwargs: float) -> Forecaster:
        """A forecaster from `to_bytes`, or from the layouts earlier releases wrote
        (format 2, without today's level; float64, no "format" in its header)."""
        (n,) = _HEADER.unpack_from(data)
        meta = json.loads(data[_HEADER.size : _HEADER.size + n])
        f = cls(**kwargs)
        f.keys = [(str(r), str(m)) for r, m in meta["keys"]]
        f._ix = {k: i for i, k in enumerate(f.keys)}
        k, body = len(f.keys), data[_HEADER.size + n :]
        hours = HOURS_PER_DAY + HOURS_PER_WEEK
        levels: list[np.ndarray] = []
        if meta.get("format") in (2, 3):
            with_levels = meta["format"] == 3
            seen_bytes = k * ((hours + 7) // 8)
            rates_size = k * (1 + hours + 1 + 2 * with_levels)
            if len(body) != rates_size * 4 + seen_bytes:
                raise ValueError("forecaster state has the wrong size")
            flat = np.frombuffer(body, dtype="<f4", count=rates_size).astype(np.float64)
            cuts = np.cumsum(
                [k, k * HOURS_PER_DAY, k * HOURS_PER_WEEK] + ([k, k] if with_levels else [])
            )
            recent, by_hour, by_week_hour, bucket_sum, *levels = np.split(flat, cuts)
            packed = np.frombuffer(body, dtype=np.uint8, offset=rates_size * 4)
            per_key = (hours + 7) // 8  # (not -1: a forecaster with no keys yet has none)
            seen = np.unpackbits(packed.reshape(k, per_key), axis=1, count=hours).astype(bool)
            seen_hour, seen_week_hour = seen[:, :HOURS_PER_DAY], seen[:, HOURS_PER_DAY:]
        else:
            flat = np.frombuffer(body, dtype="<f8")
            sizes = [k, k * 24, k * 168, k * 24, k * 168, k]
            if flat.size != sum(sizes):
                raise ValueError("forecaster state has the wrong size")
            recent, by_hour, by_week_hour, seen_h, seen_w, bucket_sum = np.split(
                flat, np.cumsum(sizes)[:-1]
            )
            seen_hour, seen_week_hour = seen_h > 0, seen_w > 0
        f.recent = recent.copy()
        f.by_hour = by_hour.reshape(k, HOURS_PER_DAY).copy()
        f.by_week_hour = by_week_hour.reshape(k, HOURS_PER_WEEK).copy()
        f.seen_hour = seen_hour.reshape(k, HOURS_PER_DAY).copy()
        f.seen_week_hour = seen_week_hour.reshape(k, HOURS_PER_WEEK).copy()
        f._bucket_sum = bucket_sum.copy()
        f._last = meta["last"]
        f._bucket = meta["bucket"]
        f._bucket_n = int(meta["bucket_n"])
        if levels:
            f.level_seen, f.level_expected = (a.copy() for a in levels)
        else:  # saved before today's level was kept: start from the last observation's
            f.level_seen = f.recent.copy()
            here, known = f._seasonal(f._bucket if f._bucket is not None else 0)
            f.level_expected = np.where(known, here, f.recent)
        return f


def week_hour(t: float) -> int:
    """Hour of the week (0..167, Monday 00:00 UTC first) of unix time `t`."""
    # 1970-01-01 was a Thursday: shift so that Monday is 0.
    return math.floor(t / 3600.0 + 72) % HOURS_PER_WEEK
