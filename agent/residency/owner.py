"""The residency owner: the one writer of every model's state.

Events come in as method calls on the agent's event loop: a request admitted
(`admit`) or answered (`release`, `abandon`), a load or unload finished
(`load_done`, `load_failed`, `unload_done`, `staged`, `prepacked`), a runner
lost or back (`runner_down`, `runner_up`), an operator or placement verb
(`load`, `unload`, `demote`, `pin`), a timer (`tick`). No method awaits, so
each event is applied whole before the next; each ends by asking the pure
planner (planner.py) where room comes from, and the slow work it decides on
leaves as effects (the `Effects` sink: load, unload, stage, ...), whose
results come back as events tagged with the generation they were started
under, so a stale result is ignored.

The guarantees, each kept in one place below:
- a model with leases (admitted requests not yet answered) is never unloaded:
  a victim with leases is DRAINING, admits nothing more, and is unloaded when
  its last lease ends (`release`);
- waiters for a promotion get their leases in the same step that makes the
  model READY (`load_done`), so no eviction can come between;
- a request that cannot be served is refused before it is admitted (`admit`:
  unknown, failed, unloaded by the operator, too many promotions waiting,
  more than its queue holds, or too big for the budget);
- at most one load per model is in flight; loads wait for room first come,
  first served; device bytes held never exceed the budget (a load measured
  above its estimate makes room at once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from edgeplex.agent.errors import (
    ModelFailed,
    ModelNotFound,
    NoRoom,
    Overloaded,
    QueueFull,
    ServeError,
    Unavailable,
)
from edgeplex.agent.repository import ModelSource
from edgeplex.agent.residency.describe import describe
from edgeplex.agent.residency.planner import QueuedLoad, Slot, candidate, plan_room, victims_for
from edgeplex.agent.residency.policies import Candidate, EvictionPolicy
from edgeplex.agent.residency.state import Intent, ModelKey, ModelRecord, Phase, Tier
from edgeplex.agent.residency.tickets import Ticket

FREQUENCY_HALF_LIFE_S = 30.0
NEVER = float("inf")


class Effects(Protocol):
    """Slow work the owner starts; each reports back through an owner event."""

    def load(self, record: ModelRecord, generation: int, fast: bool) -> None: ...
    def unload(self, record: ModelRecord, generation: int) -> None: ...
    def serve(self, record: ModelRecord) -> None: ...  # open or resume its queue
    def pause(self, record: ModelRecord) -> None: ...  # its runner is gone: hold the queue
    def stage(self, record: ModelRecord) -> None: ...
    def drop_staged(self, record: ModelRecord) -> None: ...
    def prepack(self, record: ModelRecord, generation: int) -> None: ...
    def autoscale(self, record: ModelRecord, room: bool) -> None: ...
    def changed(self) -> None: ...  # tiers or states moved (metrics)


@dataclass(frozen=True)
class Limits:
    device_budget: int | None = None
    host_budget: int | None = None
    max_pending_loads: int = 16  # promotions waiting for room before requests are refused
    prepack: bool = False
    prepack_after_s: float = 2.0


@dataclass(frozen=True)
class Loaded:
    """What a finished load reports."""

    bytes: int
    promote_s: float
    staged_bytes: int
    prepacked: bool
    source: str  # the tier it came from


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
        self._records: dict[ModelKey, ModelRecord] = {}
        self._serving: dict[str, ModelKey] = {}  # name -> the version requests reach
        self._queue_seq = 0
        self._last_prepack = -NEVER
        self.refused = 0  # requests refused for overload (the metric counts them too)

    # --- queries ----------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelRecord | None:
        key = self._serving.get(name)
        if key is None:
            return None
        if version and version != key.version:
            return self._records.get(ModelKey(name, version))
        return self._records[key]

    def records(self) -> list[ModelRecord]:
        return [self._records[k] for k in sorted(self._serving.values(), key=str)]

    def all_records(self) -> list[ModelRecord]:
        return list(self._records.values())

    def device_bytes(self) -> int:
        return sum(r.held_bytes for r in self._records.values())

    def host_bytes(self) -> int:
        return sum(r.staged_bytes for r in self._records.values())

    def pending_loads(self) -> int:
        return sum(1 for r in self._records.values() if r.phase == Phase.QUEUED)

    def fits_without_eviction(self, name: str) -> bool:
        record = self.get(name)
        budget = self.limits.device_budget
        if record is None or budget is None:
            return True
        return self.device_bytes() + record.estimate_bytes() <= budget

    # --- repository -------------------------------------------------------------------------

    def add(self, source: ModelSource, pinned: bool | None = None) -> ModelRecord:
        """Know `source` (a model found in the repository). A new version becomes the
        one requests reach; the old one drains and is dropped."""
        key = ModelKey(source.name, source.version)
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = ModelRecord(key, source)
            describe(record)
            if record.phase == Phase.FAILED and record.reason == "":
                record.reason = "cannot be described"
            record.pinned = bool(source.config and source.config.pin)
        elif record.source != source and record.phase in (Phase.ABSENT, Phase.FAILED):
            record.source = source  # config.yaml changed; the next load reads it
            record.reason = ""
            if record.phase == Phase.FAILED:
                record.enter(Phase.ABSENT)
            describe(record)
        if pinned is not None:
            record.pinned = pinned
        old = self._serving.get(source.name)
        self._serving[source.name] = key
        if old is not None and old != key:
            previous = self._records[old]
            record.pinned = record.pinned or previous.pinned
            previous.pinned = False
            self._retire(previous)
        self._effects.changed()
        return record

    # --- requests ---------------------------------------------------------------------------

    def admit(self, name: str, version: str, deadline: float) -> Ticket:
        """Admit a request for `name` or refuse it (raises a ServeError). The ticket is
        granted when the model serves now; otherwise it settles when the model is
        READY (the lease is taken then) or when its load fails."""
        record = self.get(name, version)
        if record is None:
            raise _not_found(name, version, self._serving.get(name))
        if record.disabled:
            raise Unavailable(f"model '{name}' is unloaded; load it first")
        if record.phase == Phase.FAILED:
            raise ModelFailed(f"model '{name}' failed to load: {record.reason}")
        if record.leases + len(record.waiters) >= record.config.max_queue_size:
            raise QueueFull(
                f"model '{name}': queue is full ({record.config.max_queue_size} requests waiting)"
            )
        self._touch(record)
        if record.phase == Phase.READY:
            record.leases += 1
            return Ticket(record.key, deadline, granted=True)
        self._refuse_promotion_if_overloaded(record)
        ticket = Ticket(record.key, deadline, granted=False, cold_start=str(record.tier))
        record.waiters.append(ticket)
        self._want(record)
        self._pump()
        if ticket.error is not None:  # refused in this same step: never admitted
            raise ticket.error
        return ticket

    def release(self, ticket: Ticket) -> None:
        """The admitted request's response is ready: its lease ends."""
        record = self._records.get(ticket.key)
        if record is None or not ticket.granted:
            return
        ticket.granted = False
        record.leases -= 1
        if record.phase == Phase.DRAINING and record.leases == 0:
            self._begin_unload(record)
            self._pump()

    def abandon(self, ticket: Ticket) -> None:
        """A waiter's deadline passed before its model served: it leaves the queue."""
        record = self._records.get(ticket.key)
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

    def _refuse_promotion_if_overloaded(self, record: ModelRecord) -> None:
        """Refuse, before admitting, a request whose promotion cannot be had: too big for
        the budget beside the pins, or too many promotions already waiting for room."""
        budget = self.limits.device_budget
        if record.phase == Phase.ABSENT and budget is not None:
            pinned = sum(
                r.held_bytes for r in self._records.values() if r.pinned and r is not record
            )
            needed = record.estimate_bytes()
            if needed > budget - pinned:
                raise NoRoom(
                    f"model '{record.name}' needs {needed} bytes of device memory; the budget "
                    f"is {budget} and pinned models hold {pinned}"
                )
        if record.phase == Phase.ABSENT and self.pending_loads() >= self.limits.max_pending_loads:
            self.refused += 1
            raise Overloaded(
                f"model '{record.name}' is not loaded and {self.pending_loads()} promotions "
                "are already waiting for device memory; retry shortly"
            )

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

    def demote(self, name: str, tier: Tier) -> Ticket:
        """Move `name` down to `tier` once its admitted requests are answered."""
        record = self.get(name)
        if record is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        ticket = Ticket(record.key, NEVER, granted=False, lease=False)
        intent = Intent.CACHED if tier == Tier.CACHED else Intent.STAGED
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

    def pin(self, name: str, pinned: bool) -> None:
        record = self.get(name)
        if record is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        record.pinned = pinned

    def stage(self, name: str) -> bool:
        """cached -> staged in the background if the host budget has room (shared
        runner only). True when asked for or already staged."""
        record = self.get(name)
        if record is None or record.staged_bytes:
            return bool(record and record.staged_bytes)
        budget = self.limits.host_budget
        if (
            record.phase != Phase.ABSENT
            or record.side_work
            or record.source.config is None
            or record.runner_id != "shared-0"
            or (budget is not None and self.host_bytes() + record.estimate_bytes() > budget)
        ):
            return False
        record.side_work = "stage"
        self._effects.stage(record)
        return True

    # --- results of effects -------------------------------------------------------------

    def load_done(self, key: ModelKey, generation: int, loaded: Loaded) -> None:
        record = self._records.get(key)
        if record is None or record.generation != generation or record.phase != Phase.LOADING:
            return
        now = self._clock()
        record.reserved_bytes = 0
        record.device_bytes = record.last_measured = max(1, loaded.bytes)
        record.staged_bytes = loaded.staged_bytes
        record.prepacked = loaded.prepacked
        record.usage.promote_s = loaded.promote_s
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
        self._enforce_host_budget()
        self._pump()

    def load_failed(self, key: ModelKey, generation: int, reason: str) -> None:
        record = self._records.get(key)
        if record is None or record.generation != generation:
            return
        self._fail(record, reason)
        self._pump()

    def unload_done(self, key: ModelKey, generation: int) -> None:
        record = self._records.get(key)
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
            del self._records[key]
        else:
            leftover = [t for t in record.waiters if not t.lease]
            for ticket in leftover:  # demote and unload verbs waiting for this
                ticket.settle(None)
            record.waiters = [t for t in record.waiters if t not in leftover]
            if record.waiters or intent == Intent.SERVE:
                self._want(record)  # requests arrived while it drained: bring it back
        self._enforce_host_budget()
        self._pump()

    def staged(self, key: ModelKey, staged_bytes: int) -> None:
        record = self._records.get(key)
        if record is None:
            return
        record.side_work = ""
        if staged_bytes and record.phase not in (Phase.READY, Phase.DRAINING):
            record.staged_bytes = staged_bytes
        self._enforce_host_budget()
        self._effects.changed()

    def prepacked(self, key: ModelKey, generation: int, bytes_delta: int | None) -> None:
        record = self._records.get(key)
        if record is None:
            return
        record.side_work = ""
        if record.generation != generation or record.phase != Phase.READY:
            return
        record.prepacked = True  # also when it failed: do not retry a model that cannot be
        if bytes_delta is not None:
            record.device_bytes = record.last_measured = max(1, record.device_bytes + bytes_delta)
            self._fit_measured(record)
        self._effects.changed()

    def scaled(self, key: ModelKey) -> None:
        record = self._records.get(key)
        if record is not None and record.side_work == "scale":
            record.side_work = ""

    # --- runners ------------------------------------------------------------------------

    def runner_down(self, runner_id: str) -> None:
        """Sessions on `runner_id` are gone. Serving models keep their leases and their
        room and are reloaded when the runner is back; a load that crashes its runner
        twice fails rather than crash-loop the runner others share."""
        for record in self._records.values():
            if record.runner_id != runner_id:
                continue
            if record.phase == Phase.LOADING:
                record.load_crashes += 1
                if record.load_crashes >= 2:
                    self._fail(record, "its runner crashed twice while loading it")
                    continue
            if record.phase in (Phase.LOADING, Phase.READY, Phase.DRAINING):
                record.reserved_bytes = max(record.device_bytes, record.reserved_bytes)
                record.device_bytes = 0
                record.side_work = ""
                record.generation += 1
                record.enter(Phase.RECOVERING)
                record.reason = "runner restarting"
                self._effects.pause(record)
        self._pump()  # a failed load's room is free

    def runner_up(self, runner_id: str) -> None:
        for record in self._records.values():
            if record.runner_id == runner_id and record.phase == Phase.RECOVERING:
                record.generation += 1
                record.enter(Phase.LOADING)
                self._effects.load(record, record.generation, fast=True)

    def set_device_budget(self, budget: int | None) -> None:
        """A new device budget (an operator's change, or a device shared anew). When it
        shrinks, models leave until the rest fit: lease-free ones at once, the others
        after draining; pinned models and loads in flight stay."""
        self.limits = replace(self.limits, device_budget=budget)
        if budget is not None:
            leaving = (Phase.DRAINING, Phase.UNLOADING)
            staying = sum(r.held_bytes for r in self._records.values() if r.phase not in leaving)
            others = [self._slot(r) for r in self._records.values()]
            chosen = victims_for(others, staying - budget, self.policy, self._clock())
            if staying > budget and chosen is None:  # what can go, goes
                chosen = victims_for(others, 0, _EveryVictim(), self._clock())
            for slot in chosen or []:
                victim = self._records[slot.key]
                victim.intent = Intent.STAGED
                self._retreat(victim)
        self._pump()

    # --- timer --------------------------------------------------------------------------

    def tick(self) -> None:
        """Idle expiry (policies that have it), background prepacking and elastic
        instances; called every ~100 ms."""
        now = self._clock()
        for expired in self.policy.expired(self._candidates(), now):
            record = self._by_str(expired.name)
            if record is not None and record.phase == Phase.READY and not record.leases:
                record.intent = Intent.STAGED
                self._retreat(record)
        budget = self.limits.device_budget
        room = budget is None or self.device_bytes() < 0.95 * budget
        for record in self._records.values():
            ready = record.phase == Phase.READY and not record.side_work
            if ready and record.config.max_instances is not None:
                self._effects.autoscale(record, room)
        self._maybe_prepack(now)
        self._pump()

    # --- internals ----------------------------------------------------------------------

    def _want(self, record: ModelRecord) -> None:
        """Queue a load of `record` unless one is queued, in flight or it serves."""
        if record.phase == Phase.ABSENT:
            self._queue_seq += 1
            record.queued_at = self._queue_seq
            record.enter(Phase.QUEUED)
        elif record.phase in (Phase.DRAINING, Phase.UNLOADING) and record.intent != Intent.RETIRE:
            record.intent = Intent.SERVE

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
            del self._records[record.key]
        elif record.phase == Phase.READY:
            self._retreat(record)

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
        error = ModelFailed(f"model '{record.name}' failed to load: {reason}")
        waiters, record.waiters = record.waiters, []
        for ticket in waiters:
            ticket.settle(error)
        self._effects.pause(record)
        self._effects.changed()

    def _drop_staged(self, record: ModelRecord) -> None:
        if record.staged_bytes:
            record.staged_bytes = 0
            self._effects.drop_staged(record)

    def _pump(self) -> None:
        """Ask the planner for room for the queued loads and act on its answer."""
        queued = sorted(
            (r for r in self._records.values() if r.phase == Phase.QUEUED),
            key=lambda r: r.queued_at,
        )
        if not queued:
            self._effects.changed()
            return
        plan = plan_room(
            [self._slot(r) for r in self._records.values()],
            [QueuedLoad(r.key, r.estimate_bytes()) for r in queued],
            self.limits.device_budget,
            self.policy,
            self._clock(),
        )
        for key in plan.unload:
            record = self._records[key]
            record.intent = Intent.STAGED
            self._begin_unload(record)
        for key in plan.drain:
            record = self._records[key]
            record.intent = Intent.STAGED
            record.enter(Phase.DRAINING)
        for key, why in plan.refuse.items():
            record = self._records[key]
            record.enter(Phase.ABSENT)
            record.explicit = False
            error = NoRoom(f"model '{record.name}' {why}")
            waiters, record.waiters = record.waiters, []
            for ticket in waiters:
                ticket.settle(error)
        for key in plan.start:
            record = self._records[key]
            record.generation += 1
            record.reserved_bytes = record.estimate_bytes()
            record.enter(Phase.LOADING)
            fast = bool(record.waiters) and not record.explicit
            self._effects.load(record, record.generation, fast=fast)
        self._effects.changed()

    def _fit_measured(self, record: ModelRecord) -> None:
        """A session measured above its estimate: make room among the other serving
        models at once, or send this one back (after its admitted requests)."""
        budget = self.limits.device_budget
        excess = 0 if budget is None else self.device_bytes() - budget
        if excess <= 0:
            return
        others = [self._slot(r) for r in self._records.values() if r is not record]
        chosen = victims_for(others, excess, self.policy, self._clock())
        if chosen is None:
            record.reason = f"measured {record.device_bytes} bytes, more than the budget holds"
            record.intent = Intent.STAGED
            self._retreat(record)
            return
        for slot in chosen:
            victim = self._records[slot.key]
            victim.intent = Intent.STAGED
            self._retreat(victim)

    def _enforce_host_budget(self) -> None:
        budget = self.limits.host_budget
        if budget is None:
            return
        idle = sorted(
            (
                r
                for r in self._records.values()
                if r.staged_bytes and r.phase in (Phase.ABSENT, Phase.FAILED)
            ),
            key=lambda r: r.usage.last_used,
        )
        for record in idle:
            if self.host_bytes() <= budget:
                return
            self._drop_staged(record)

    def _maybe_prepack(self, now: float) -> None:
        """Rebuild with prepacked weights one fast-promoted model at a time (at most one a
        second), while the budget has room for the transient copy."""
        limits = self.limits
        if not limits.prepack or now - self._last_prepack < 1.0:
            return
        if any(r.side_work == "prepack" for r in self._records.values()):
            return
        budget = limits.device_budget
        for record in self._records.values():
            if (
                record.phase != Phase.READY
                or record.prepacked
                or record.side_work
                or now - record.usage.loaded_at < limits.prepack_after_s
            ):
                continue
            if budget is not None and self.device_bytes() + record.staged_bytes > budget:
                continue
            record.side_work = "prepack"
            self._last_prepack = now
            self._effects.prepack(record, record.generation)
            return

    def _touch(self, record: ModelRecord) -> None:
        """Recency, GDSF credit, and a frequency that halves every FREQUENCY_HALF_LIFE_S,
        so demand that moved away stops counting."""
        usage = record.usage
        now = self._clock()
        if usage.last_used:
            usage.frequency *= 0.5 ** ((now - usage.last_used) / FREQUENCY_HALF_LIFE_S)
        usage.last_used = now
        usage.frequency += 1
        usage.credit = max(usage.credit, self.policy.stamp())

    def _slot(self, record: ModelRecord) -> Slot:
        return Slot(
            key=record.key,
            phase=record.phase,
            held=record.held_bytes,
            leases=record.leases,
            pinned=record.pinned,
            priority=record.source.config.priority if record.source.config else 0,
            last_used=record.usage.last_used,
            frequency=record.usage.frequency,
            credit=record.usage.credit,
            promote_s=record.usage.promote_s,
        )

    def _candidates(self) -> list[Candidate]:
        return [candidate(self._slot(r)) for r in self._records.values() if r.phase == Phase.READY]

    def _by_str(self, name: str) -> ModelRecord | None:
        for record in self._records.values():
            if str(record.key) == name:
                return record
        return None


def _not_found(name: str, version: str, serving: ModelKey | None) -> ServeError:
    if serving is not None and version:
        return ModelNotFound(
            f"model '{name}' has no version '{version}' (serving version {serving.version})"
        )
    return ModelNotFound(f"model '{name}' is not in the repository")


class _EveryVictim:
    """All movable models, for a budget cut that leaves no better choice."""

    name = "all"
    evicts_on_demand = True

    def choose(self, candidates: list[Candidate], needed: int, loaded_count: int, now: float):  # type: ignore[no-untyped-def]
        return [c for c in candidates if not c.pinned]

    def expired(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        return []

    def stamp(self) -> float:
        return 0.0
