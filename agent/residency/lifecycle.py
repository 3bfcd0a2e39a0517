"""The transitions of a model's lifecycle, as the owner applies them.

`Lifecycle` is the owner's hands: queue a load, let a model retreat (unload
now, or drain first), fail it, drop its staged copy, and `pump` (ask the pure
planner for room and act on the plan). Only `Residency` (owner.py) calls it,
from inside one of its events, so the owner stays the one writer; this class
holds no state of its own beyond what it was given.
"""

from __future__ import annotations

from collections.abc import Callable

from edgeplex.agent.catalog.forms import ORIGINAL
from edgeplex.agent.catalog.repository import ModelSource
from edgeplex.agent.oip.errors import ModelFailed, NoRoom, Unavailable
from edgeplex.agent.residency.contract import Effects, Limits
from edgeplex.agent.residency.hot_set import recent_requests
from edgeplex.agent.residency.ledger import Ledger
from edgeplex.agent.residency.planner import plan_room, victims_for
from edgeplex.agent.residency.state import Chore, Intent, ModelKey, ModelRecord, Phase
from edgeplex.agent.residency.upkeep import budget_cut, host_budget_drops
from edgeplex.eviction import EvictionPolicy

# Seconds without an eviction or a load as a variant before room counts as
# returned: loads start as originals again, and models serving a variant swap back.
CALM_S = 5.0


class Lifecycle:
    def __init__(
        self,
        ledger: Ledger,
        limits: Limits,
        policy: EvictionPolicy,
        effects: Effects,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self.limits = limits
        self._policy = policy
        self._effects = effects
        self._clock = clock

    def want(self, record: ModelRecord) -> None:
        """Queue a load of `record` unless one is queued, in flight or it serves."""
        if record.phase == Phase.ABSENT:
            record.queued_at = self._ledger.next_in_queue()
            record.enter(Phase.QUEUED)
        elif record.phase in (Phase.DRAINING, Phase.UNLOADING) and record.intent != Intent.RETIRE:
            record.intent = Intent.SERVE

    def retreat(self, record: ModelRecord) -> None:
        """A READY model leaves: at once without leases, else after draining them."""
        if record.leases:
            record.enter(Phase.DRAINING)
        else:
            self.begin_unload(record)

    def retire(self, record: ModelRecord) -> None:
        record.intent = Intent.RETIRE
        if record.phase in (Phase.ABSENT, Phase.FAILED, Phase.QUEUED):
            self.drop_staged(record)
            for ticket in record.waiters:
                ticket.settle(Unavailable(f"model '{record.name}' was replaced; retry"))
            self._ledger.forget(record.key)
        elif record.phase == Phase.READY:
            self.retreat(record)

    def replace_artifact(self, record: ModelRecord, source: ModelSource) -> None:
        """The artifact changed under the same version: drop the staged copy of the old
        one, and reload a serving model from the new one once its leases end."""
        self.drop_staged(record)
        record.source = source
        if record.phase == Phase.FAILED:
            record.enter(Phase.ABSENT)
            record.reason = ""
        elif record.phase == Phase.READY:
            record.intent = Intent.SERVE
            self.retreat(record)
            self.pump()

    def begin_unload(self, record: ModelRecord) -> None:
        record.generation += 1
        record.enter(Phase.UNLOADING)
        if record.intent == Intent.NONE:
            record.intent = Intent.STAGED
        self._effects.unload(record, record.generation)

    def fail(self, record: ModelRecord, reason: str) -> None:
        record.generation += 1
        record.reserved_bytes = record.device_bytes = 0
        record.enter(Phase.FAILED)
        record.reason = reason
        record.explicit = False
        error = ModelFailed(f"model '{record.name}' failed to load: {reason}")
        waiters, record.waiters = record.waiters, []
        for ticket in waiters:
            ticket.settle(error)
        self._effects.pause(record)

    def lose_session(self, record: ModelRecord, why: str = "") -> None:
        """Its runner died (`why`, when known). A serving model keeps its leases and its
        room and waits (RECOVERING) for the runner to come back; a load that crashes its
        runner twice fails rather than crash-loop the runner others share."""
        because = f": {why}" if why else ""
        if record.phase == Phase.LOADING:
            record.load_crashes += 1
            if record.load_crashes >= 2:
                self.fail(record, f"its runner crashed twice while loading it{because}")
                return
        if record.phase not in (Phase.LOADING, Phase.READY, Phase.DRAINING):
            return
        if record.phase == Phase.DRAINING and record.intent == Intent.SERVE:
            # Still on its way out: reloaded for the requests it owes, then it drains;
            # those that arrived meanwhile bring it back after that.
            record.intent = Intent.STAGED
        if record.chore.prepacking or record.chore == Chore.REFORM:
            record.reserved_bytes = 0  # the transient copy died with the runner
        record.reserved_bytes = max(record.device_bytes, record.reserved_bytes)
        record.device_bytes = 0
        record.chore = Chore.NONE
        record.generation += 1
        record.enter(Phase.RECOVERING)
        record.reason = f"runner restarting{because}"
        self._effects.pause(record)

    def swap(self, record: ModelRecord, form: str) -> None:
        """Move a serving model to `form` in place: the runner builds the new session
        beside the old one, so both are held until the swap (`SideWork.reformed`)."""
        record.chore = Chore.REFORM
        record.reserved_bytes = record.device_bytes + record.estimate_bytes(form)
        self._effects.reform(record, record.generation, form)

    def reload(self, record: ModelRecord) -> None:
        """Its runner is back: load it again into the room it kept (as the form it
        served, unless that variant went with a replaced artifact)."""
        if record.form not in record.variants:
            record.form = ORIGINAL
        record.generation += 1
        record.enter(Phase.LOADING)
        self._effects.load(record, record.generation, fast=True)

    def drop_staged(self, record: ModelRecord) -> None:
        if record.staged_bytes or record.staged_variant_bytes:
            record.staged_bytes = record.staged_variant_bytes = 0
            self._effects.drop_staged(record)

    def pump(self) -> dict[ModelKey, str]:
        """Ask the planner for room for the queued loads and act on its answer. Returns
        the loads it refused: a load that admitted requests wait for stays queued
        (a pin or a budget cut made after they were admitted may be undone before
        their deadlines); any other is dropped."""
        budget = self.limits.device_budget
        queued = self._ledger.queued_loads(budget)
        if not queued:
            return {}
        plan = plan_room(
            self._ledger.slots(),
            queued,
            budget,
            self._policy,
            self._clock(),
            self.limits.max_promotions,
            pressed=self._clock() - self._ledger.pressed_at < CALM_S,
        )
        if plan.unload or plan.drain or plan.demote:
            self._ledger.pressed_at = self._clock()
        for key, form in plan.demote.items():
            self.swap(self._ledger.by_key[key], form)
        for key in plan.unload:
            record = self._ledger.by_key[key]
            record.intent = Intent.STAGED
            self.begin_unload(record)
        for key in plan.drain:
            record = self._ledger.by_key[key]
            record.intent = Intent.STAGED
            record.enter(Phase.DRAINING)
        for key, why in plan.refuse.items():
            record = self._ledger.by_key[key]
            if any(t.lease for t in record.waiters):
                record.reason = f"waiting for room: {why}"
                continue
            record.enter(Phase.ABSENT)
            record.explicit = False
            error = NoRoom(f"model '{record.name}' {why}")
            waiters, record.waiters = record.waiters, []
            for ticket in waiters:
                ticket.settle(error)
        for key in plan.start:
            record = self._ledger.by_key[key]
            record.generation += 1
            record.form = plan.forms.get(key, ORIGINAL)
            if record.form:
                self._ledger.pressed_at = self._clock()
            record.reserved_bytes = self._ledger.load_bytes(record, budget)
            record.enter(Phase.LOADING)
            fast = bool(record.waiters) and not record.explicit
            self._effects.load(record, record.generation, fast=fast)
        return plan.refuse

    def fit_measured(self, record: ModelRecord) -> None:
        """A session measured above its estimate: make room among the other serving
        models at once, or send this one back (after its admitted requests)."""
        budget = self.limits.device_budget
        excess = 0 if budget is None else self._ledger.device_bytes() - budget
        if excess <= 0:
            return
        others = self._ledger.slots(besides=record)
        chosen = victims_for(others, excess, self._policy, self._clock())
        if chosen is None:
            record.reason = f"measured {record.device_bytes} bytes, more than the budget holds"
            record.intent = Intent.STAGED
            self.retreat(record)
            return
        for slot in chosen:
            victim = self._ledger.by_key[slot.key]
            victim.intent = Intent.STAGED
            self.retreat(victim)

    def touch(self, record: ModelRecord) -> None:
        """Recency, GDSF credit, and a frequency that halves every
        hot_set.FREQUENCY_HALF_LIFE_S, so demand that moved away stops counting."""
        usage = record.usage
        now = self._clock()
        usage.frequency = recent_requests(usage, now) + 1
        usage.last_used = now
        usage.credit = max(usage.credit, self._policy.stamp())

    def fit_host_budget(self) -> None:
        for record in host_budget_drops(self._ledger, self.limits.host_budget):
            self.drop_staged(record)

    def fit_budget(self) -> None:
        for slot in budget_cut(
            self._ledger, self.limits.device_budget, self._policy, self._clock()
        ):
            victim = self._ledger.by_key[slot.key]
            victim.intent = Intent.STAGED
            self.retreat(victim)

    def upgrade(self, record: ModelRecord, now: float) -> None:
        """Rebuild `record` with prepacked weights. The rebuild holds a second copy of
        its weights until the swap, so that copy is reserved at once, like a load's
        bytes, and made room for among colder models when the budget is full: a hot
        model served 3x slower for want of a transient copy costs more than a cold
        one's reload. The rebuild starts on a tick once the reservation fits."""
        need = record.staged_bytes or record.device_bytes
        budget = self.limits.device_budget
        if budget is not None:
            staying = self._ledger.device_bytes() - self._ledger.leaving_bytes()
            missing = staying + need - budget
            if missing > 0:
                others = [s for s in self._ledger.slots() if s.key != record.key]
                victims = victims_for(others, missing, self._policy, now)
                if victims is None:
                    return
                for slot in victims:
                    victim = self._ledger.by_key[slot.key]
                    victim.intent = Intent.STAGED
                    self.retreat(victim)
        record.chore = Chore.PREPACK_WAIT
        record.reserved_bytes = record.device_bytes + need

    def start_upgrades(self) -> None:
        budget = self.limits.device_budget
        for record in self._ledger.all_records():
            if record.chore != Chore.PREPACK_WAIT:
                continue
            if budget is None or self._ledger.device_bytes() <= budget:
                record.chore = Chore.PREPACK
                self._effects.prepack(record, record.generation)
