"""The owner's smaller decisions, as pure functions over the ledger: whether a
promotion may be admitted at all, which staged copies the host budget drops,
which model to rebuild prepacked next, what a cut device budget takes.

The owner applies what they return; nothing here writes a record.
"""

from __future__ import annotations

from edgeplex.agent.oip.errors import NoRoom, Overloaded, ServeError
from edgeplex.agent.residency.contract import Limits
from edgeplex.agent.residency.ledger import Ledger
from edgeplex.agent.residency.planner import Slot, movable, victims_for
from edgeplex.agent.residency.state import SHARED_RUNNER, ModelRecord, Phase
from edgeplex.eviction import EvictionPolicy

PREPACK_INTERVAL_S = 1.0  # at most one rebuild a second: each one copies a model's weights


def promotion_refusal(record: ModelRecord, ledger: Ledger, limits: Limits) -> ServeError | None:
    """Why a request that needs `record` promoted must be refused before admission:
    it cannot fit beside the pins, or too many promotions already wait for room."""
    if record.phase != Phase.ABSENT:
        return None  # its load is queued or in flight already: joining it costs nothing
    budget = limits.device_budget
    if budget is not None:
        pinned = ledger.pinned_bytes(besides=record)
        needed = record.certain_bytes()
        if needed > budget - pinned:
            return NoRoom(
                f"model '{record.name}' needs {needed} bytes of device memory; the budget "
                f"is {budget} and pinned models hold {pinned}"
            )
    waiting = ledger.pending_loads()
    if waiting >= limits.max_pending_loads:
        return Overloaded(
            f"model '{record.name}' is not loaded and {waiting} promotions are already "
            "waiting for device memory; retry shortly"
        )
    return None


def may_stage(record: ModelRecord, ledger: Ledger, limits: Limits) -> bool:
    """cached -> staged in the background: only a model at rest, on the shared runner,
    when the host budget has room for its copy."""
    budget = limits.host_budget
    return (
        record.phase == Phase.ABSENT
        and not record.chore
        and record.source.config is not None
        and record.runner_id == SHARED_RUNNER
        and (budget is None or ledger.host_bytes() + record.estimate_bytes() <= budget)
    )


def host_budget_drops(ledger: Ledger, budget: int | None) -> list[ModelRecord]:
    """Staged copies to drop, least recently used first, until the host budget holds."""
    if budget is None:
        return []
    over = ledger.host_bytes() - budget
    drops = []
    for record in ledger.idle_staged():
        if over <= 0:
            break
        drops.append(record)
        over -= record.staged_bytes
    return drops


def prepack_choice(
    ledger: Ledger, limits: Limits, now: float, last_prepack: float
) -> ModelRecord | None:
    """The next fast-promoted model to rebuild with prepacked weights: the most used
    one that is hot (expected to stay) or has been loaded for `prepack_after_s`,
    one rebuild at a time, at most one a second."""
    if not limits.prepack or now - last_prepack < PREPACK_INTERVAL_S:
        return None
    records = ledger.all_records()
    if any(r.chore.prepacking for r in records):
        return None
    eligible = [
        r
        for r in records
        if r.phase == Phase.READY
        and not r.prepacked
        and not r.chore
        and (r.hot or now - r.usage.loaded_at >= limits.prepack_after_s)
    ]
    return max(eligible, key=lambda r: r.usage.frequency, default=None)


def budget_cut(
    ledger: Ledger, budget: int | None, policy: EvictionPolicy, now: float
) -> list[Slot]:
    """What leaves when the device budget shrinks: the policy's victims for the excess,
    or, when no choice of victims is enough, every serving model that may leave."""
    if budget is None:
        return []
    leaving = (Phase.DRAINING, Phase.UNLOADING)
    staying = sum(r.held_bytes for r in ledger.all_records() if r.phase not in leaving)
    if staying <= budget:
        return []
    slots = ledger.slots()
    chosen = victims_for(slots, staying - budget, policy, now)
    return movable(slots) if chosen is None else chosen
