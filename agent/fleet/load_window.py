"""Per-interval load of this agent, for the control plane's load reports.

`record()` is called by Agent.infer on the event loop for every request of a
known model; the fleet link calls `take()` once per report interval, which
returns the interval's figures and starts a new one. Bounded: latency samples
are a reservoir of at most RESERVOIR per model.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

RESERVOIR = 1024
MAX_MODELS = 10_000  # distinct names per interval; beyond it new names are not counted


@dataclass
class ModelWindow:
    by_region: dict[str, int] = field(default_factory=dict)
    seen: int = 0
    samples: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        if not self.samples:
            return 0.0
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LoadWindow:
    def __init__(self) -> None:
        self._models: dict[str, ModelWindow] = {}
        self._started = time.monotonic()

    def record(self, model: str, region: str, seconds: float) -> None:
        """`model` and `region` are names already (the control plane refuses a report
        naming anything else): a repository's model or one checked by the caller, and
        this site's region (checked in its settings) or a peer's checked hop header."""
        w = self._models.get(model)
        if w is None:
            if len(self._models) >= MAX_MODELS:
                return
            w = self._models[model] = ModelWindow()
        w.by_region[region] = w.by_region.get(region, 0) + 1
        w.seen += 1
        if len(w.samples) < RESERVOIR:
            w.samples.append(seconds)
        else:
            k = random.randrange(w.seen)
            if k < RESERVOIR:
                w.samples[k] = seconds

    def take(self) -> tuple[float, dict[str, ModelWindow]]:
        """(interval seconds, per-model window) since the last take."""
        now = time.monotonic()
        elapsed, self._started = max(now - self._started, 1e-6), now
        models, self._models = self._models, {}
        return elapsed, models
