"""The residency owner: the one writer of every model's state.

Events are its methods, called on the agent's event loop: requests admitted,
answered or past their deadline; loads, unloads, staging and prepacking
finished; runners down or up; operator and placement verbs; the tick; a new
budget. None awaits, so each is applied whole. Each ends by asking the pure
planner where room comes from (`Lifecycle.pump`); slow work leaves as effects
whose results come back as events tagged with a generation, so a stale one is
ignored. docs/architecture.md ("Residency: one owner") states the guarantees:
a model with leases is never unloaded, waiters get their leases in the step
that makes the model READY, and what cannot be served is refused before it is
admitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace

from edgeplex.agent.catalog.repository import ModelSource
from edgeplex.agent.oip.errors import (
    ModelFailed,
    ModelNotFound,
    NoRoom,
    QueueFull,
    Unavailable,
)
from edgeplex.agent.residency.contract import Effects, Limits, Loaded
from edgeplex.agent.residency.describe import describe
from edgeplex.agent.residency.hot_set import demand, hot_set
from edgeplex.agent.residency.ledger import Ledger
from edgeplex.agent.residency.lifecycle import Lifecycle
from edgeplex.agent.residency.scaling import scale_target
from edgeplex.agent.residency.side_work import SideWork
from edgeplex.agent.residency.state import Chore, Intent, ModelKey, ModelRecord, Phase, Tier
from edgeplex.agent.residency.tickets import Ticket
from edgeplex.agent.residency.upkeep import (
    may_stage,
    prepack_choice,
    promotion_refusal,
)
from edgeplex.eviction import EvictionPolicy

NEVER = float("inf")


class Residency:
    def __init__(
        self,
        limits: Limits,
        policy: EvictionPolicy,
        effects: Effects,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.policy = policy
        self._effects = effects
        self._clock = clock
        self.ledger = Ledger()
        self._life = Lifecycle(self.ledger, limits, policy, effects, clock)
        self.side = SideWork(self.ledger, self._life, effects, clock)  # background work's events
        self._last_prepack = -NEVER

    # --- reads (the ledger answers; nothing here writes) ------------------------------

    def get(self, name: str, version: str = "") -> ModelRecord | None:
        return self.ledger.get(name, version)

    def records(self) -> list[ModelRecord]:
        return self.ledger.records()

    def device_bytes(self) -> int:
        return self.ledger.device_bytes()

    # --- repository -------------------------------------------------------------------------

    def add(self, source: ModelSource, keep: Collection[str] = ()) -> ModelRecord:
        """Know `source`, the version requests naming none reach. Versions in `keep` (older
        ones its version policy serves too: `add_version`) stay; others drain and go."""
        record = self.add_version(source)
        old = self.ledger.serving.get(source.name)
        self.ledger.serving[source.name] = record.key
        if old is not None and old != record.key:
            previous = self.ledger.by_key[old]
            record.pinned = record.pinned or previous.pinned
            previous.pinned = False
        for other in [r for r in self.ledger.all_records() if r.name == source.name]:
            if other is not record and other.version not in keep and other.intent != Intent.RETIRE:
                self._life.retire(other)
        return record

    def add_version(self, source: ModelSource) -> ModelRecord:
        """Know `source` without making it the version requests reach by default."""
        key = ModelKey(source.name, source.version)
        record = self.ledger.by_key.get(key)
        if record is None:
            record = ModelRecord(key, source)
            self.ledger.track(record)
            describe(record)
            record.pinned = bool(source.config and source.config.pin)
        elif record.source.digest != source.digest:
            self._life.replace_artifact(record, source)
            describe(record)
            record.variants.clear()  # built from the old artifact
        elif record.source != source and record.phase in (Phase.ABSENT, Phase.FAILED):
            record.source = source  # config.yaml changed; the next load reads it
            record.reason = ""
            if record.phase == Phase.FAILED:
                record.enter(Phase.ABSENT)
            describe(record)
        self.side.wants_variants(record)
        return record

    # --- requests ---------------------------------------------------------------------------

    def admit(self, name: str, version: str, deadline: float) -> Ticket:
        """Admit a request for `name` or refuse it (raises a ServeError). The ticket is
        granted when the model serves now; otherwise it settles when the model is
        READY (the lease is taken then) or when its load fails."""
        record = self.get(name, version)
        if record is None:
            raise ModelNotFound(
                f"model '{name}' has no version '{version}'"
                if version
                else f"model '{name}' is not in the repository"
            )
        if record.disabled:
            raise Unavailable(f"model '{name}' is unloaded; load it first")
        if record.phase == Phase.FAILED:
            raise ModelFailed(f"model '{name}' failed to load: {record.reason}")
        if record.leases + len(record.waiters) >= record.config.max_queue_size:
            raise QueueFull(
                f"model '{name}': queue is full ({record.config.max_queue_size} requests waiting)"
            )
        self._life.touch(record)
        if record.phase == Phase.READY:
            record.leases += 1
            return Ticket(record.key, deadline, granted=True)
        refusal = promotion_refusal(record, self.ledger, self.limits)
        if refusal is not None:
            raise refusal
        ticket = Ticket(record.key, deadline, granted=False, cold_start=str(record.tier))
        record.waiters.append(ticket)
        self._life.want(record)
        refused = self._life.pump()
        if record.key in refused:  # refused in this same step: never admitted
            record.waiters.remove(ticket)
            if not record.waiters and record.phase == Phase.QUEUED:
                record.enter(Phase.ABSENT)
            raise NoRoom(f"model '{record.name}' {refused[record.key]}")
        if ticket.error is not None:
            raise ticket.error
        return ticket

    def release(self, ticket: Ticket) -> None:
        """The admitted request is done (answered, failed, or its caller went away): its
        lease ends, or, if it was still waiting for its model, it leaves the queue."""
        if not ticket.settled:
            self.abandon(ticket)
            return
        record = self.ledger.by_key.get(ticket.key)
        if record is None or not ticket.granted:
            return
        ticket.granted = False
        record.leases -= 1
        if record.phase == Phase.DRAINING and record.leases == 0:
            self._life.begin_unload(record)
            self._life.pump()

    def abandon(self, ticket: Ticket) -> None:
        """A waiter's deadline passed before its model served: it leaves the queue."""
        record = self.ledger.by_key.get(ticket.key)
        if record is None:
            return
        if ticket.granted:
            self.release(ticket)
            return
        if ticket in record.waiters:
            record.waiters.remove(ticket)
        if record.phase == Phase.QUEUED and not record.waiters and not record.explicit:
            record.enter(Phase.ABSENT)
            self._life.pump()

    # --- operator and placement verbs ---------------------------------------------------

    def load(self, name: str, explicit: bool = True) -> Ticket:
        """Serve `name` (explicit: also after an OIP unload, and after a failure). The
        ticket settles when it serves or fails; it holds no lease."""
        record = self.get(name)
        if record is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        if explicit:
            record.disabled = False
            if record.phase == Phase.FAILED:
                record.load_crashes = 0
                record.enter(Phase.ABSENT)
                record.reason = ""
                describe(record)  # a fault of its config or interface fails it again
        ticket = Ticket(record.key, NEVER, granted=False, lease=False)
        if record.phase == Phase.READY:
            if record.intent in (Intent.STAGED, Intent.CACHED):
                record.intent = Intent.NONE
            ticket.settle(None)
            return ticket
        if record.phase == Phase.FAILED:
            ticket.settle(ModelFailed(f"model '{name}' failed to load: {record.reason}"))
            return ticket
        record.waiters.append(ticket)
        record.explicit = True
        self._life.want(record)
        self._life.pump()
        return ticket

    def unload(self, name: str) -> Ticket:
        """OIP unload: admitted requests finish, then the model drops to staged and is
        served again only after an explicit load."""
        record = self.get(name)
        if record is not None:
            record.disabled = True
        return self.demote(name, Tier.STAGED)

    def demote(self, name: str, tier: Tier) -> Ticket:
        """Move `name` down to `tier` once its admitted requests are answered."""
        record = self.get(name)
        if record is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        ticket = Ticket(record.key, NEVER, granted=False, lease=False)
        intent = Intent.CACHED if tier == Tier.CACHED else Intent.STAGED
        if record.phase in (Phase.ABSENT, Phase.FAILED):
            if intent == Intent.CACHED and record.staged_bytes:
                self._life.drop_staged(record)
            ticket.settle(None)
            return ticket
        if record.phase == Phase.QUEUED and not record.waiters:
            record.enter(Phase.ABSENT)
            ticket.settle(None)
            return ticket
        record.intent = intent
        record.explicit = False
        record.waiters.append(ticket)  # settled when the unload is done
        if record.phase == Phase.READY:
            self._life.retreat(record)
        self._life.pump()
        return ticket

    def pin(self, name: str, pinned: bool) -> None:
        record = self.get(name)
        if record is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        record.pinned = pinned
        if not pinned:
            self._life.fit_budget()  # what the pin held over a cut budget may leave now
            self._life.pump()

    def stage(self, name: str) -> bool:
        """cached -> staged in the background if the host budget has room (shared
        runner only). True when asked for or already staged."""
        record = self.get(name)
        if record is None or record.staged_bytes:
            return bool(record and record.staged_bytes)
        if not may_stage(record, self.ledger, self.limits):
            return False
        record.chore = Chore.STAGE
        self._effects.stage(record)
        return True

    # --- results of effects -------------------------------------------------------------

    def load_done(self, key: ModelKey, generation: int, loaded: Loaded) -> None:
        record = self.ledger.by_key.get(key)
        if record is None or record.generation != generation or record.phase != Phase.LOADING:
            return
        now = self._clock()
        record.reserved_bytes = 0
        record.measure(loaded.bytes)
        if record.form:
            record.staged_variant_bytes = max(record.staged_variant_bytes, loaded.staged_bytes)
        else:
            record.staged_bytes = loaded.staged_bytes
        record.prepacked = loaded.prepacked
        if loaded.on_demand:
            record.usage.promote_s = loaded.promote_s
            record.usage.setup_s = 0.0
        else:
            # Warmed up and maybe prepacked: more than a promotion on demand, which this
            # does not measure (routing would forward what it could promote sooner);
            # evicting it loses that work.
            record.usage.setup_s = loaded.promote_s
        self.ledger.observe_promotion(
            loaded.promote_s, loaded.staged_bytes, provisional=not loaded.on_demand
        )
        record.usage.loaded_at = now
        record.usage.credit = self.policy.stamp()
        record.load_crashes = 0
        record.explicit = False
        record.enter(Phase.READY)
        record.reason = ""
        self._effects.serve(record)
        waiters, record.waiters = record.waiters, []
        for ticket in waiters:  # leases in this same step: no eviction can come between
            if ticket.lease:
                record.leases += 1
            ticket.settle(None)
        if record.intent in (Intent.STAGED, Intent.CACHED, Intent.RETIRE):
            self._life.retreat(record)
        self._life.fit_measured(record)
        self._life.fit_host_budget()
        self._life.pump()

    def load_failed(self, key: ModelKey, generation: int, reason: str) -> None:
        record = self.ledger.by_key.get(key)
        if record is None or record.generation != generation:
            return
        self._life.fail(record, reason)
        self._life.pump()

    def unload_done(self, key: ModelKey, generation: int) -> None:
        record = self.ledger.by_key.get(key)
        if record is None or record.generation != generation:
            return
        record.device_bytes = record.reserved_bytes = 0
        record.enter(Phase.ABSENT)
        intent, record.intent = record.intent, Intent.NONE
        if intent in (Intent.CACHED, Intent.RETIRE):
            self._life.drop_staged(record)
        if intent == Intent.RETIRE:
            for ticket in record.waiters:
                ticket.settle(Unavailable(f"model '{record.name}' was replaced; retry"))
            self.ledger.forget(key)
        else:
            leftover = [t for t in record.waiters if not t.lease]
            for ticket in leftover:  # demote and unload verbs waiting for this
                ticket.settle(None)
            record.waiters = [t for t in record.waiters if t not in leftover]
            if record.waiters or intent == Intent.SERVE:
                self._life.want(record)  # requests arrived while it drained: bring it back
        self._life.fit_host_budget()
        self._life.pump()

    # --- runners ------------------------------------------------------------------------

    def runner_down(self, runner_id: str, why: str = "") -> None:
        """Sessions on `runner_id` are gone (`why`: how it died, when known). Serving
        models keep their leases and their room and are reloaded when the runner is
        back; a load that crashes its runner twice fails rather than crash-loop the
        runner others share."""
        for record in self.ledger.all_records():
            if record.runner_id == runner_id:
                self._life.lose_session(record, why)
        self._life.pump()  # a failed load's room is free

    def runner_up(self, runner_id: str) -> None:
        for record in self.ledger.by_key.values():
            if record.runner_id == runner_id and record.phase == Phase.RECOVERING:
                self._life.reload(record)

    def _scale(self, record: ModelRecord, room: bool) -> None:
        """Elastic instances: one more while its queue is deeper than a round, back to
        the configured count once idle (scaling.py); up only while there is room."""
        load = self._effects.queue_load(record)
        if load is None:
            return
        config = record.config
        assert config.max_instances is not None
        target = scale_target(
            depth=load.depth,
            instances=load.instances,
            minimum=config.instance_count,
            maximum=max(config.max_instances, config.instance_count),
            max_batch_size=record.max_batch_size,
            idle_s=load.idle_s,
            scale_down_idle_s=config.scale_down_idle_s,
        )
        if target == load.instances or (target > load.instances and not room):
            return
        record.chore = Chore.SCALE
        self._effects.scale(record, target)

    def set_device_budget(self, budget: int | None) -> None:
        """A new device budget (an operator's change, or a device shared anew). When it
        shrinks, models leave until the rest fit: lease-free ones at once, the others
        after draining; pinned models and loads in flight stay."""
        self.limits = self._life.limits = replace(self.limits, device_budget=budget)
        self._life.fit_budget()
        self._life.pump()

    # --- timer --------------------------------------------------------------------------

    def tick(self) -> None:
        """Idle expiry (policies that have it), the hot models, background prepacking
        and elastic instances; called every ~100 ms."""
        now = self._clock()
        for expired in self.policy.expired(self.ledger.candidates(), now):
            record = self.ledger.by_str(expired.name)
            if record is not None and record.phase == Phase.READY and not record.leases:
                record.intent = Intent.STAGED
                self._life.retreat(record)
        budget = self.limits.device_budget
        room = budget is None or self.device_bytes() < 0.95 * budget
        for record in self.ledger.by_key.values():
            ready = record.phase == Phase.READY and not record.chore
            if ready and record.config.max_instances is not None:
                self._scale(record, room)
        hot = hot_set(demand(self.ledger.all_records(), now), budget, self.limits.hot_share)
        for record in self.ledger.by_key.values():
            record.hot = record.key in hot
        chosen = prepack_choice(self.ledger, self.limits, now, self._last_prepack)
        if chosen is not None:
            self._life.upgrade(chosen, now)
            self._last_prepack = now
        self._life.start_upgrades()
        self.side.want_variants()
        self.side.restore_forms()
        self._life.pump()
