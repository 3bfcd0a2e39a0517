"""The residency owner: every change of a model's state, in one class.

`Residency`'s public methods are the events, called on the agent's event loop:
models found in the repository; requests admitted, answered or past their
deadline; operator and placement verbs; loads, unloads, staging, prepacking,
variant builds and form swaps finished; runners down or up; the tick; a new
budget. None awaits, so each is applied whole. The private methods below them
are the transitions those events make (queue a load, retreat, drain, fail, drop
a staged copy), and each event ends by asking the pure planner where room
comes from (`_pump`). Slow work leaves as effects whose results come back as
events tagged with a generation, so a stale one is ignored. Nothing else
writes a record. docs/architecture.md ("Residency: one owner") states the
guarantees: a model with leases is never unloaded, waiters get their leases in
the step that makes the model READY, and what cannot be served is refused
before it is admitted.

Forms: a model that accepts variants (`quality: any`) loads as its smallest
usable variant when its original would take room from others (the planner
decides, `_pump` applies it). When the site has gone CALM_S without such
pressure and no load waits, the most used model serving a variant is swapped
back to its original, one at a time, provided the original fits beside
everything held: the runner builds the new session while the old one serves,
so both are reserved until the swap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace

from edgeplex.agent.catalog.forms import ORIGINAL, VariantReport
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
from edgeplex.agent.residency.hot_set import demand, hot_set, recent_requests
from edgeplex.agent.residency.ledger import Ledger
from edgeplex.agent.residency.planner import plan_room, victims_for
from edgeplex.agent.residency.scaling import scale_target
from edgeplex.agent.residency.state import Chore, Intent, ModelKey, ModelRecord, Phase, Tier
from edgeplex.agent.residency.tickets import Ticket
from edgeplex.agent.residency.upkeep import (
    budget_cut,
    host_budget_drops,
    may_stage,
    prepack_choice,
    promotion_refusal,
)
from edgeplex.eviction import EvictionPolicy

NEVER = float("inf")
# Seconds without an eviction or a load as a variant before room counts as
# returned: loads start as originals again, and models serving a variant swap back.
CALM_S = 5.0


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
        self._wanting: set[ModelKey] = set()  # models whose variants are not all built
        self._last_prepack = -NEVER

    # --- reads (the ledger answers; nothing here writes) ------------------------------

    def get(self, name: str, version: str = "") -> ModelRecord | None:
        return self.ledger.get(name, version)

    def records(self) -> list[ModelRecord]:
        """The version of each model that requests naming none reach."""
        return self.ledger.records()

    def every_version(self, name: str | None = None) -> list[ModelRecord]:
        """Every version known (of `name`), by model and version number."""
        found = [r for r in self.ledger.all_records() if name in (None, r.name)]
        return sorted(found, key=lambda r: (r.name, len(r.version), r.version))

    def device_bytes(self) -> int:
        return self.ledger.device_bytes()

    def no_room(self, record: ModelRecord) -> str:
        """Why `record`, not on the device, cannot be promoted at all now (it needs
        more than the budget beside the pins), or "" when it can."""
        refusal = promotion_refusal(record, self.ledger, self.limits)
        return refusal.message if isinstance(refusal, NoRoom) else ""

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
                self._retire(other)
        return record

    def add_version(self, source: ModelSource) -> ModelRecord:
        """Know `source` without making it the version requests reach by default."""
        key = ModelKey(source.name, source.version)
        record = self.ledger.by_key.get(key)
        if record is None:
            record = ModelRecord(key, source)
            self.ledger.track(record)
            self._describe(record)
            record.pinned = bool(source.config and source.config.pin)
        elif record.source.digest != source.digest:
            self._replace_artifact(record, source)
            self._describe(record)
            record.variants.clear()  # built from the old artifact
        elif record.source != source and record.phase in (Phase.ABSENT, Phase.FAILED):
            record.source = source  # config.yaml changed; the next load reads it
            record.reason = ""
            if record.phase == Phase.FAILED:
                record.enter(Phase.ABSENT)
            self._describe(record)
        self._wants_variants(record)
        return record

    # --- requests ---------------------------------------------------------------------------

    def admit(self, name: str, version: str, deadline: float) -> Ticket:
        """Admit a request for `name` or refuse it (raises a ServeError). The ticket is
        granted when the model serves now; otherwise it settles when the model is
        READY (the lease is taken then) or when its load fails."""
        record = self.get(name, version)
        if record is None:
            raise ModelNotFound.unknown(name, version)
        if record.disabled:
            raise Unavailable(
                f"Request for unknown model: '{name}' has no available versions "
                "(unloaded: load it first)"
            )
        if record.phase == Phase.FAILED:
            raise ModelFailed.load(name, record.reason)
        if record.leases + len(record.waiters) >= record.config.max_queue_size:
            raise QueueFull(
                f"model '{name}': queue is full ({record.config.max_queue_size} requests waiting)"
            )
        self._touch(record)
        if record.phase == Phase.READY:
            record.leases += 1
            return Ticket(record.key, deadline, granted=True)
        refusal = promotion_refusal(record, self.ledger, self.limits)
        if refusal is not None:
            raise refusal
        ticket = Ticket(record.key, deadline, granted=False, cold_start=str(record.tier))
        record.waiters.append(ticket)
        self._want(record)
        refused = self._pump()
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
            self._begin_unload(record)
            self._pump()

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
            self._pump()

    def hold(self, name: str, version: str) -> ModelRecord | None:
        """A live sequence of `name` holds it: while held, the serving model is neither
        evicted nor swapped to a smaller form (its requests are not counted: no lease).
        Returns what `unhold` takes, None for a model not in the repository."""
        record = self.get(name, version)
        if record is not None:
            record.holds += 1
        return record

    def unhold(self, record: ModelRecord) -> None:
        """A sequence ended or idled out: its hold on the model ends (and with the last
        one, a demote that waited for them goes on)."""
        record.holds -= 1
        if record.holds == 0 and record.phase == Phase.READY:
            if record.leave_by < NEVER:
                self._leave(record)
            self._pump()  # loads waiting for its room may take it now

    # --- operator and placement verbs ---------------------------------------------------

    def load(self, name: str, explicit: bool = True) -> Ticket:
        """Serve `name` (explicit: also after an OIP unload, and after a failure). The
        ticket settles when it serves or fails; it holds no lease."""
        record = self.get(name)
        if record is None:
            raise ModelNotFound.unknown(name)
        if explicit:
            record.disabled = False
            if record.phase == Phase.FAILED:
                record.load_crashes = 0
                record.enter(Phase.ABSENT)
                record.reason = ""
                self._describe(record)  # a fault of its config or interface fails it again
        ticket = Ticket(record.key, NEVER, granted=False, lease=False)
        if record.disabled:  # placement's ask for a model the operator unloaded: no
            ticket.settle(None)
            return ticket
        if record.phase == Phase.READY:
            if record.intent in (Intent.STAGED, Intent.CACHED):
                record.intent = Intent.NONE
                record.leave_by = NEVER  # a demote waiting for sequences, called off
            ticket.settle(None)
            return ticket
        if record.phase == Phase.FAILED:
            ticket.settle(ModelFailed.load(name, record.reason))
            return ticket
        record.waiters.append(ticket)
        record.explicit = True
        self._want(record)
        self._pump()
        return ticket

    def unload(self, name: str) -> Ticket:
        """OIP unload: admitted requests finish, then the model drops to staged and is
        served again only after an explicit load."""
        record = self.get(name)
        if record is not None:
            record.disabled = True
        return self.demote(name, Tier.STAGED)

    def demote(self, name: str, tier: Tier, after_sequences: bool = False) -> Ticket:
        """Move `name` down to `tier` once its admitted requests are answered. With
        `after_sequences` (placement's), a serving model that live sequences hold
        keeps serving until the last one ends, for at most `sequence_drain_s`: the
        ticket settles at once, and a load before then keeps the model."""
        record = self.get(name)
        if record is None:
            raise ModelNotFound.unknown(name)
        ticket = Ticket(record.key, NEVER, granted=False, lease=False)
        intent = Intent.CACHED if tier == Tier.CACHED else Intent.STAGED
        wait_s = self.limits.sequence_drain_s
        if after_sequences and record.phase == Phase.READY and record.holds and wait_s > 0:
            record.intent = intent
            record.explicit = False
            record.leave_by = min(record.leave_by, self._clock() + wait_s)
            ticket.settle(None)
            return ticket
        if record.phase in (Phase.ABSENT, Phase.FAILED):
            if intent == Intent.CACHED and record.staged_bytes:
                self._drop_staged(record)
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
            self._retreat(record)
        self._pump()
        return ticket

    def set_placed(self, names: Collection[str]) -> None:
        """The models the control plane's desired state loads at this site (all their
        versions): loads of any other model take no room from them."""
        wanted = set(names)
        for record in self.ledger.all_records():
            record.placed = record.name in wanted
        self._pump()  # loads waiting beside the plan may be refused now

    def pin(self, name: str, pinned: bool) -> None:
        record = self.get(name)
        if record is None:
            raise ModelNotFound.unknown(name)
        record.pinned = pinned
        if not pinned:
            self._fit_budget()  # what the pin held over a cut budget may leave now
            self._pump()

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
            self._retreat(record)
        self._fit_measured(record)
        self._fit_host_budget()
        self._pump()

    def load_failed(self, key: ModelKey, generation: int, reason: str) -> None:
        record = self.ledger.by_key.get(key)
        if record is None or record.generation != generation:
            return
        self._fail(record, reason)
        self._pump()

    def unload_done(self, key: ModelKey, generation: int) -> None:
        record = self.ledger.by_key.get(key)
        if record is None or record.generation != generation:
            return
        record.device_bytes = record.reserved_bytes = 0
        record.enter(Phase.ABSENT)
        intent, record.intent = record.intent, Intent.NONE
        if intent in (Intent.CACHED, Intent.RETIRE):
            self._drop_staged(record)
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
                self._want(record)  # requests arrived while it drained: bring it back
        self._fit_host_budget()
        self._pump()

    # --- runners ------------------------------------------------------------------------

    def runner_down(self, runner_id: str, why: str = "") -> None:
        """Sessions on `runner_id` are gone (`why`: how it died, when known). Serving
        models keep their leases and their room and are reloaded when the runner is
        back; a load that crashes its runner twice fails rather than crash-loop the
        runner others share."""
        for record in self.ledger.all_records():
            if record.runner_id == runner_id:
                self._lose_session(record, why)
        self._pump()  # a failed load's room is free

    def runner_up(self, runner_id: str) -> None:
        for record in self.ledger.by_key.values():
            if record.runner_id == runner_id and record.phase == Phase.RECOVERING:
                self._reload(record)

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
        self.limits = replace(self.limits, device_budget=budget)
        self._fit_budget()
        self._pump()

    # --- timer --------------------------------------------------------------------------

    def tick(self) -> None:
        """Idle expiry (policies that have it), the hot models, background prepacking
        and elastic instances; called every ~100 ms."""
        now = self._clock()
        for expired in self.policy.expired(self.ledger.candidates(), now):
            record = self.ledger.by_str(expired.name)
            if record is not None and record.phase == Phase.READY and not record.leases:
                record.intent = Intent.STAGED
                self._retreat(record)
        budget = self.limits.device_budget
        room = budget is None or self.device_bytes() < 0.95 * budget
        for record in self.ledger.by_key.values():
            if record.phase != Phase.READY:
                continue
            if record.leave_by <= now:
                self._leave(record)  # its sequences outlasted placement's patience
            elif not record.chore and record.config.max_instances is not None:
                self._scale(record, room)
        hot = hot_set(demand(self.ledger.all_records(), now), budget, self.limits.hot_share)
        for record in self.ledger.by_key.values():
            record.hot = record.key in hot
        chosen = prepack_choice(self.ledger, self.limits, now, self._last_prepack)
        if chosen is not None:
            self._upgrade(chosen, now)
            self._last_prepack = now
        self._start_upgrades()
        self._want_variants()
        self._restore_forms()
        self._pump()

    # --- background work reported back: staging, prepacking, instances, forms -------

    def staged(self, key: ModelKey, staged_bytes: int, form: str = ORIGINAL) -> None:
        record = self.ledger.by_key.get(key)
        if record is None:
            return
        record.chore = Chore.NONE
        if form:
            record.staged_variant_bytes = max(record.staged_variant_bytes, staged_bytes)
        elif staged_bytes and record.phase not in (Phase.READY, Phase.DRAINING):
            record.staged_bytes = staged_bytes
        self._stage_smaller(record)
        self._fit_host_budget()

    def prepacked(self, key: ModelKey, generation: int, bytes_delta: int | None) -> None:
        record = self.ledger.by_key.get(key)
        if record is None:
            return
        record.chore = Chore.NONE
        if record.generation != generation or record.phase != Phase.READY:
            return
        record.reserved_bytes = 0  # the transient copy is gone
        record.prepacked = True  # also when it failed: do not retry a model that cannot be
        if bytes_delta is not None:
            record.measure(record.device_bytes + bytes_delta)
            self._fit_measured(record)

    def scaled(self, key: ModelKey) -> None:
        record = self.ledger.by_key.get(key)
        if record is not None and record.chore == Chore.SCALE:
            record.chore = Chore.NONE

    # --- variants -------------------------------------------------------------------------

    def _wants_variants(self, record: ModelRecord) -> None:
        """`record` is new, or its artifact or config changed: build what it lacks."""
        if record.source.config is not None and record.source.config.variants:
            self._wanting.add(record.key)

    def _want_variants(self) -> None:
        """Build the variants models' configs ask for and they do not have yet (on the
        tick, so staging at start goes first; each model's build waits for its other
        side work)."""
        for key in list(self._wanting):
            record = self.ledger.by_key.get(key)
            config = record.source.config if record is not None else None
            if record is None or config is None:
                self._wanting.discard(key)
                continue
            missing: list[str] = [f for f in config.variants if f not in record.variants]
            if not missing:
                self._wanting.discard(key)
            elif not record.chore and record.phase != Phase.FAILED:
                record.chore = Chore.VARIANTS
                self._effects.build_variants(record, missing)

    def variants_built(self, key: ModelKey, digest: str, reports: list[VariantReport]) -> None:
        record = self.ledger.by_key.get(key)
        if record is None:
            return
        if record.chore == Chore.VARIANTS:
            record.chore = Chore.NONE
        if record.source.digest != digest:  # replaced meanwhile: the tick builds anew
            record.variants.clear()
            return
        for report in reports:
            record.variants[report.form] = report
        self._stage_smaller(record)
        self._pump()  # a queued load may start as a variant now

    def _stage_smaller(self, record: ModelRecord) -> None:
        """Stage the variant a model would load as, like its original, so that a load
        as the variant is a staged promotion; once, when no other side work runs."""
        smaller = record.smaller_form()
        if smaller and not record.staged_variant_bytes and not record.chore:
            record.chore = Chore.STAGE
            self._effects.stage(record, smaller)

    # --- forms ----------------------------------------------------------------------------

    def _restore_forms(self) -> None:
        """Swap the most used model serving a variant back to its original, when room
        has been calm long enough and the original fits beside everything held."""
        now = self._clock()
        if now - self.ledger.pressed_at < CALM_S or self.ledger.queued():
            return
        records = self.ledger.all_records()
        if any(r.chore == Chore.REFORM for r in records):
            return
        waiting = [
            r
            for r in records
            if r.phase == Phase.READY and r.form and not r.chore and r.intent == Intent.NONE
        ]
        budget = self.limits.device_budget
        for record in sorted(waiting, key=lambda r: -r.usage.frequency):
            need = record.estimate_bytes(ORIGINAL)
            if budget is None or self.ledger.device_bytes() + need <= budget:
                self._swap(record, ORIGINAL)
                return

    def reformed(self, key: ModelKey, generation: int, form: str, loaded: Loaded | None) -> None:
        """The runner swapped `key`'s session to `form` (`loaded`), or could not (None)."""
        record = self.ledger.by_key.get(key)
        if record is None:
            return
        if record.chore == Chore.REFORM:
            record.chore = Chore.NONE
        if record.generation == generation and record.phase == Phase.READY:
            record.reserved_bytes = 0  # the old session is gone, or the new one never came
            if loaded is not None:
                if form:
                    record.staged_variant_bytes = max(
                        record.staged_variant_bytes, loaded.staged_bytes
                    )
                record.form = form
                record.measure(loaded.bytes)
                record.prepacked = loaded.prepacked
                self._fit_measured(record)
        self._pump()

    # --- the transitions the events make (called only from the events above) ---------

    def _describe(self, record: ModelRecord) -> None:
        """The interface read from the model's file (describe.py), or FAILED with why."""
        described = describe(record.key, record.source)
        if isinstance(described, str):
            record.enter(Phase.FAILED)
            record.reason = described
        else:
            record.inputs, record.outputs, record.max_batch_size = described

    def _want(self, record: ModelRecord) -> None:
        """Queue a load of `record` unless one is queued, in flight or it serves."""
        if record.phase == Phase.ABSENT:
            record.queued_at = self.ledger.next_in_queue()
            record.enter(Phase.QUEUED)
        elif record.phase in (Phase.DRAINING, Phase.UNLOADING) and record.intent != Intent.RETIRE:
            record.intent = Intent.SERVE

    def _leave(self, record: ModelRecord) -> None:
        """Placement's demote, which waited for the model's sequences, goes on."""
        record.leave_by = NEVER
        if record.intent in (Intent.STAGED, Intent.CACHED):
            self._retreat(record)

    def _retreat(self, record: ModelRecord) -> None:
        """A READY model leaves: at once without leases, else after draining them."""
        if record.leases:
            record.enter(Phase.DRAINING)
        else:
            self._begin_unload(record)

    def _retire(self, record: ModelRecord) -> None:
        record.intent = Intent.RETIRE
        if record.phase in (Phase.ABSENT, Phase.FAILED, Phase.QUEUED):
            self._drop_staged(record)
            for ticket in record.waiters:
                ticket.settle(Unavailable(f"model '{record.name}' was replaced; retry"))
            self.ledger.forget(record.key)
        elif record.phase == Phase.READY:
            self._retreat(record)

    def _replace_artifact(self, record: ModelRecord, source: ModelSource) -> None:
        """The artifact changed under the same version: drop the staged copy of the old
        one, and reload a serving model from the new one once its leases end."""
        self._drop_staged(record)
        record.source = source
        if record.phase == Phase.FAILED:
            record.enter(Phase.ABSENT)
            record.reason = ""
        elif record.phase == Phase.READY:
            record.intent = Intent.SERVE
            self._retreat(record)
            self._pump()

    def _begin_unload(self, record: ModelRecord) -> None:
        record.generation += 1
        record.enter(Phase.UNLOADING)
        if record.intent == Intent.NONE:
            record.intent = Intent.STAGED
        self._effects.unload(record, record.generation)

    def _fail(self, record: ModelRecord, reason: str) -> None:
        record.generation += 1
        record.reserved_bytes = record.device_bytes = 0
        record.enter(Phase.FAILED)
        record.reason = reason
        record.explicit = False
        error = ModelFailed.load(record.name, reason)
        waiters, record.waiters = record.waiters, []
        for ticket in waiters:
            ticket.settle(error)
        self._effects.pause(record)

    def _lose_session(self, record: ModelRecord, why: str = "") -> None:
        """Its runner died (`why`, when known). A serving model keeps its leases and its
        room and waits (RECOVERING) for the runner to come back; a load that crashes its
        runner twice fails rather than crash-loop the runner others share."""
        because = f": {why}" if why else ""
        if record.phase == Phase.LOADING:
            record.load_crashes += 1
            if record.load_crashes >= 2:
                self._fail(record, f"its runner crashed twice while loading it{because}")
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

    def _swap(self, record: ModelRecord, form: str) -> None:
        """Move a serving model to `form` in place: the runner builds the new session
        beside the old one, so both are held until the swap (`SideWork.reformed`)."""
        record.chore = Chore.REFORM
        record.reserved_bytes = record.device_bytes + record.estimate_bytes(form)
        self._effects.reform(record, record.generation, form)

    def _reload(self, record: ModelRecord) -> None:
        """Its runner is back: load it again into the room it kept (as the form it
        served, unless that variant went with a replaced artifact). Fast, without a
        warm-up, only while requests wait for it; an idle model warms up again (its
        `model_warmup` samples too), as any load no request waits for does."""
        if record.form not in record.variants:
            record.form = ORIGINAL
        record.generation += 1
        record.enter(Phase.LOADING)
        fast = bool(record.leases or record.waiters)
        self._effects.load(record, record.generation, fast=fast)

    def _drop_staged(self, record: ModelRecord) -> None:
        if record.staged_bytes or record.staged_variant_bytes:
            record.staged_bytes = record.staged_variant_bytes = 0
            self._effects.drop_staged(record)

    def _pump(self) -> dict[ModelKey, str]:
        """Ask the planner for room for the queued loads and act on its answer. Returns
        the loads it refused: a load that admitted requests wait for stays queued
        (a pin or a budget cut made after they were admitted may be undone before
        their deadlines); any other is dropped."""
        budget = self.limits.device_budget
        queued = self.ledger.queued_loads(budget)
        if not queued:
            return {}
        plan = plan_room(
            self.ledger.slots(),
            queued,
            budget,
            self.policy,
            self._clock(),
            self.limits.max_promotions,
            pressed=self._clock() - self.ledger.pressed_at < CALM_S,
        )
        if plan.unload or plan.drain or plan.demote:
            self.ledger.pressed_at = self._clock()
        for key, form in plan.demote.items():
            self._swap(self.ledger.by_key[key], form)
        for key in plan.unload:
            record = self.ledger.by_key[key]
            record.intent = Intent.STAGED
            self._begin_unload(record)
        for key in plan.drain:
            record = self.ledger.by_key[key]
            record.intent = Intent.STAGED
            record.enter(Phase.DRAINING)
        for key, why in plan.refuse.items():
            record = self.ledger.by_key[key]
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
            record = self.ledger.by_key[key]
            record.generation += 1
            record.form = plan.forms.get(key, ORIGINAL)
            if record.form:
                self.ledger.pressed_at = self._clock()
            record.reserved_bytes = self.ledger.load_bytes(record, budget)
            record.enter(Phase.LOADING)
            fast = bool(record.waiters) and not record.explicit
            self._effects.load(record, record.generation, fast=fast)
        return plan.refuse

    def _fit_measured(self, record: ModelRecord) -> None:
        """A session measured above its estimate: make room among the other serving
        models at once, or send this one back (after its admitted requests)."""
        budget = self.limits.device_budget
        excess = 0 if budget is None else self.ledger.device_bytes() - budget
        if excess <= 0:
            return
        others = self.ledger.slots(besides=record)
        chosen = victims_for(others, excess, self.policy, self._clock())
        if chosen is None:
            record.reason = f"measured {record.device_bytes} bytes, more than the budget holds"
            record.intent = Intent.STAGED
            self._retreat(record)
            return
        for slot in chosen:
            victim = self.ledger.by_key[slot.key]
            victim.intent = Intent.STAGED
            self._retreat(victim)

    def _touch(self, record: ModelRecord) -> None:
        """Recency, GDSF credit, and a frequency that halves every
        hot_set.FREQUENCY_HALF_LIFE_S, so demand that moved away stops counting."""
        usage = record.usage
        now = self._clock()
        usage.frequency = recent_requests(usage, now) + 1
        usage.last_used = now
        usage.credit = max(usage.credit, self.policy.stamp())

    def _fit_host_budget(self) -> None:
        for record in host_budget_drops(self.ledger, self.limits.host_budget):
            self._drop_staged(record)

    def _fit_budget(self) -> None:
        for slot in budget_cut(self.ledger, self.limits.device_budget, self.policy, self._clock()):
            victim = self.ledger.by_key[slot.key]
            victim.intent = Intent.STAGED
            self._retreat(victim)

    def _upgrade(self, record: ModelRecord, now: float) -> None:
        """Rebuild `record` with prepacked weights. The rebuild holds a second copy of
        its weights until the swap, so that copy is reserved at once, like a load's
        bytes, and made room for among colder models when the budget is full: a hot
        model served 3x slower for want of a transient copy costs more than a cold
        one's reload. The rebuild starts on a tick once the reservation fits."""
        need = record.staged_bytes or record.device_bytes
        budget = self.limits.device_budget
        if budget is not None:
            staying = self.ledger.device_bytes() - self.ledger.leaving_bytes()
            missing = staying + need - budget
            if missing > 0:
                others = [s for s in self.ledger.slots() if s.key != record.key]
                victims = victims_for(others, missing, self.policy, now)
                if victims is None:
                    return
                for slot in victims:
                    victim = self.ledger.by_key[slot.key]
                    victim.intent = Intent.STAGED
                    self._retreat(victim)
        record.chore = Chore.PREPACK_WAIT
        record.reserved_bytes = record.device_bytes + need

    def _start_upgrades(self) -> None:
        budget = self.limits.device_budget
        for record in self.ledger.all_records():
            if record.chore != Chore.PREPACK_WAIT:
                continue
            if budget is None or self.ledger.device_bytes() <= budget:
                record.chore = Chore.PREPACK
                self._effects.prepack(record, record.generation)
