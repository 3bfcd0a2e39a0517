"""The models a site's own demand keeps resident: a pure choice.

Under over-commit a promotion on demand takes its room from serving models
with no request in flight at that instant, and those are, as often as not, the
most requested ones: their requests are answered fastest. Left to that, the
hottest models are evicted and promoted again many times a second (4x over a
Zipf stream: the most requested model promoted 50-70 times a second), and never
stay long enough to be rebuilt with prepacked weights.

`hot_set` names the models that promotions take room from last: those whose
share of recent demand is at least half their share of the device budget (a
model the size of a quarter of the budget needs an eighth of the requests),
most requested first, while they fit in `share` of the budget. The rest of
the budget is left to the loads of everything else, which drain a colder
model before they evict a hot one; room for a budget cut or a prepack
rebuild also comes from the others first. A hot model still leaves when
nothing else can make room (a load larger than the rest of the budget, a
deep budget cut): only pins are absolute. Hot models are also the first rebuilt with prepacked
weights (upkeep.prepack_choice).

Pure: the owner passes each model's recent requests and bytes (`demand`) on
every tick and marks the models named.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edgeplex.agent.residency.state import ModelKey, ModelRecord, Usage

# Of its share of the budget, the share of demand that makes a model hot.
DEMAND_PER_BUDGET = 0.5
# A model's request count halves every this long, so demand that moved away stops
# counting (in eviction as here).
FREQUENCY_HALF_LIFE_S = 30.0


@dataclass(frozen=True, slots=True)
class Demand:
    key: ModelKey
    requests: float  # recent requests, decayed (Usage.frequency at now)
    bytes: int  # device bytes it holds, or would


def hot_set(demand: Iterable[Demand], budget: int | None, share: float) -> set[ModelKey]:
    """The hot models: most requested first, each with at least DEMAND_PER_BUDGET of
    its share of the budget in requests, together within `share` of the budget."""
    models = sorted(demand, key=lambda d: -d.requests)
    total = sum(d.requests for d in models)
    if budget is None or share <= 0 or total <= 0:
        return set()
    room = share * budget
    hot = set()
    for model in models:
        wanted = model.requests / total >= DEMAND_PER_BUDGET * model.bytes / budget
        if wanted and model.bytes <= room:
            hot.add(model.key)
            room -= model.bytes
    return hot


def demand(records: Iterable[ModelRecord], now: float) -> list[Demand]:
    """Each requested model's recent requests and the bytes it holds or would. Pinned
    models stay anyway: they take no room from the hot ones."""
    return [
        Demand(r.key, recent_requests(r.usage, now), r.estimate_bytes())
        for r in records
        if r.usage.frequency > 0 and not r.pinned
    ]


def recent_requests(usage: Usage, now: float) -> float:
    """A model's request count, halved every FREQUENCY_HALF_LIFE_S since its last
    request."""
    if not usage.last_used:
        return usage.frequency
    elapsed = max(0.0, now - usage.last_used)
    return usage.frequency * 0.5 ** (elapsed / FREQUENCY_HALF_LIFE_S)
