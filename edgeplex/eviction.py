"""Which loaded models to demote when a load needs device memory: pure policies.

Every policy has the same small interface, so no caller asks which one it has:

- `choose(candidates, needed, loaded_count, now)`: the victims, in order, that
  free `needed` bytes (and, for count-based policies, a slot), or None when no
  choice of victims would do;
- `expired(candidates, now)`: models to demote on a tick even without a load
  (idle past a TTL; [] for policies that evict only on demand);
- `stamp()`: the credit a model earns when it is used (GDSF's clock; 0 else);
- `evicts_on_demand`: whether a load waits for victims (True) or is refused
  when it does not fit (the baseline `none`, and `ttl`, which evicts only what
  has expired).

Policies never log, never touch processes and keep no hidden state beyond
what `choose` documents, so tests and benchmarks drive them directly.

Pinned models are never victims. Models with leases (admitted requests) are
ranked like any other, by their value: the owner unloads a victim at once
when it has no leases and drains it first when it has. Ranking busy models
last would evict a hot model in the instant it happens to be idle, ahead of
a cold one that happens to be busy; under closed-loop load that thrashes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

PolicyName = Literal["gdsf", "lru", "ttl", "none"]

# In a fleet, a model the control plane placed at a site is kept there against
# the loads of models only a request asked for when its promotion takes longer
# than this: evicting it would send its requests out of the region, or make
# them wait for it to come back, until the next placement, and a stream of
# requests for the catalog's tail would empty the site of its plan. A placed
# model that comes back faster costs its requests no more than a short wait, so
# a site with room for few cheap models still swaps between them freely.
PLACED_KEPT_OVER_S = 0.05


def kept_for_plan(placed: bool, promote_s: float) -> bool:
    """Whether a load that only a request asked for may not take this model's room."""
    return placed and promote_s > PLACED_KEPT_OVER_S


@dataclass(slots=True)  # a value, not frozen only for speed (planner.py)
class Candidate:
    name: str
    bytes: int
    promote_s: float  # measured staged -> loaded time (the cost of bringing it back)
    last_used: float  # monotonic seconds
    frequency: float  # requests served while loaded (decayed by the table)
    priority: int = 0
    pinned: bool = False
    in_flight: int = 0  # leases: admitted requests not yet answered
    # GDSF: the policy's clock when the model was last used (the table stamps it).
    credit: float = 0.0


class EvictionPolicy(Protocol):
    name: str
    evicts_on_demand: bool

    def choose(
        self, candidates: list[Candidate], needed: int, loaded_count: int, now: float
    ) -> list[Candidate] | None:
        """Victims freeing at least `needed` bytes (and, for count-based policies,
        making room for one more model), or None if impossible."""

    def expired(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        """Models to demote now, without a load asking for room."""

    def stamp(self) -> float:
        """The credit a model earns on each use."""


class _OnDemand:
    """Defaults of policies that evict only when a load needs room."""

    evicts_on_demand = True

    def expired(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        return []

    def stamp(self) -> float:
        return 0.0


def _take_until(ordered: list[Candidate], needed: int) -> list[Candidate] | None:
    victims, freed = [], 0
    for candidate in ordered:
        if freed >= needed:
            break
        victims.append(candidate)
        freed += candidate.bytes
    return victims if freed >= needed else None


class GreedyDualSizeFrequency(_OnDemand):
    """GDSF (Cherkasova 1998): keep the models whose frequency x reload cost / size
    is highest. H = credit + frequency * promote_s**2 * 2**priority / bytes, where
    credit is the clock when the model was last used; evict the lowest H, then
    raise the clock to the highest victim's H, so that a model hot long ago ages
    out against models used since.

    `clock` is the only state: read it, or pass it back, to replay decisions."""

    name = "gdsf"

    def __init__(self, clock: float = 0.0) -> None:
        self.clock = clock

    def stamp(self) -> float:
        return self.clock

    def value(self, c: Candidate) -> float:
        # The cost of a miss grows faster than the promotion time: a promotion well
        # under the SLO costs (almost) nothing, a long one misses the SLO for the
        # request and for every request that queues behind it. Squaring the time
        # protects the models whose promotions are long (measured: docs/lab-notebook.md).
        cost = max(c.promote_s, 1e-4) ** 2 * (2.0**c.priority)
        return c.credit + max(c.frequency, 1.0) * cost / max(c.bytes, 1) * 1e9

    def choose(
        self, candidates: list[Candidate], needed: int, loaded_count: int, now: float
    ) -> list[Candidate] | None:
        if needed <= 0:
            return []
        movable = [c for c in candidates if not c.pinned]
        ordered = sorted(movable, key=lambda c: (self.value(c), c.name))
        victims = _take_until(ordered, needed)
        if victims:
            self.clock = max(self.clock, max(self.value(v) for v in victims))
        return victims


class LeastRecentlyUsedByCount(_OnDemand):
    """Ray Serve multiplexing's rule: at most `max_models` loaded; evict the least
    recently used. Bytes are still respected (evicting more when needed)."""

    name = "lru"

    def __init__(self, max_models: int) -> None:
        self.max_models = max_models

    def choose(
        self, candidates: list[Candidate], needed: int, loaded_count: int, now: float
    ) -> list[Candidate] | None:
        movable = sorted(
            (c for c in candidates if not c.pinned),
            key=lambda c: (c.last_used, c.name),
        )
        excess = max(0, loaded_count + 1 - self.max_models)
        victims = movable[:excess]
        if len(victims) < excess:
            return None
        freed = sum(v.bytes for v in victims)
        if freed < needed:
            more = _take_until(movable[excess:], needed - freed)
            if more is None:
                return None
            victims += more
        return victims


class IdleTimeToLive:
    """Ollama's keep_alive: a model stays loaded until idle for `ttl_s`; only models
    idle that long may be evicted (the table also unloads them on a timer)."""

    name = "ttl"
    evicts_on_demand = False

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s

    def expired(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        return sorted(
            (
                c
                for c in candidates
                if not c.pinned and not c.in_flight and now - c.last_used >= self.ttl_s
            ),
            key=lambda c: c.last_used,
        )

    def choose(
        self, candidates: list[Candidate], needed: int, loaded_count: int, now: float
    ) -> list[Candidate] | None:
        return _take_until(self.expired(candidates, now), needed)

    def stamp(self) -> float:
        return 0.0


class NoOverCommit(_OnDemand):
    """The baseline: what does not fit is refused."""

    name = "none"
    evicts_on_demand = False

    def choose(
        self, candidates: list[Candidate], needed: int, loaded_count: int, now: float
    ) -> list[Candidate] | None:
        return [] if needed <= 0 else None


def make_policy(name: PolicyName, *, lru_max_models: int, idle_ttl_s: float) -> EvictionPolicy:
    if name == "gdsf":
        return GreedyDualSizeFrequency()
    if name == "lru":
        return LeastRecentlyUsedByCount(lru_max_models)
    if name == "ttl":
        return IdleTimeToLive(idle_ttl_s)
    return NoOverCommit()
