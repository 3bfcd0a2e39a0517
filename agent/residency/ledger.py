"""The residency table: every model's record, the version each name serves,
and the questions asked of them (bytes per tier, queued loads, the planner's
snapshot).

The owner (owner.py) is its only writer; everything here reads. Records come
and go through `track` and `forget`, and tell the ledger of every phase change
(`ModelRecord.watch`), so the models that hold device memory and the queued
loads are indexed: the planner's snapshot, asked for after nearly every event,
costs the models that hold memory, not the whole catalog.
"""

from __future__ import annotations

from typing import Any

from edgeplex.agent.catalog.forms import ORIGINAL
from edgeplex.agent.residency.planner import QueuedLoad, Slot, candidate
from edgeplex.agent.residency.state import HOLDS_DEVICE, Chore, ModelKey, ModelRecord, Phase, Tier
from edgeplex.eviction import Candidate


class Ledger:
    def __init__(self) -> None:
        self.by_key: dict[ModelKey, ModelRecord] = {}
        self.serving: dict[str, ModelKey] = {}  # name -> the version requests reach
        self._holding: dict[ModelKey, ModelRecord] = {}  # phase in HOLDS_DEVICE
        self._queued: dict[ModelKey, ModelRecord] = {}  # phase QUEUED
        # Seconds per staged byte of this site's promotions (a moving average), and
        # whether it comes only from loads that did more than a promotion.
        self.promote_s_per_byte: float | None = None
        self._rate_provisional = False
        self._queue_seq = 0  # the order of queued loads (FIFO)
        # When room was last short enough that a load started as a variant, or a
        # model had to leave for another: originals come back only after a calm.
        self.pressed_at = float("-inf")

    def next_in_queue(self) -> int:
        """The place of a load queued now, after every one queued before."""
        self._queue_seq += 1
        return self._queue_seq

    def track(self, record: ModelRecord) -> None:
        self.by_key[record.key] = record
        record.watch = self._moved
        self._moved(record)

    def forget(self, key: ModelKey) -> None:
        record = self.by_key.pop(key)
        record.watch = None
        self._holding.pop(key, None)
        self._queued.pop(key, None)

    def _moved(self, record: ModelRecord) -> None:
        key = record.key
        if record.phase in HOLDS_DEVICE:
            self._holding[key] = record
        else:
            self._holding.pop(key, None)
        if record.phase == Phase.QUEUED:
            self._queued[key] = record
        else:
            self._queued.pop(key, None)

    def observe_promotion(
        self, promote_s: float, staged_bytes: int, provisional: bool = False
    ) -> None:
        """The owner reports each load's staged-equivalent time. A `provisional` one
        (a load that also warmed up or prepacked) stands in only until this site
        has promoted a model on demand."""
        if staged_bytes <= 0 or promote_s <= 0:
            return
        rate, prior = promote_s / staged_bytes, self.promote_s_per_byte
        if provisional and prior is not None and not self._rate_provisional:
            return
        if prior is None or (self._rate_provisional and not provisional):
            self.promote_s_per_byte = rate
        else:
            self.promote_s_per_byte = 0.8 * prior + 0.2 * rate
        self._rate_provisional = provisional

    def promote_estimate(self, record: ModelRecord) -> float | None:
        """Seconds to promote a staged model here: its own last promotion, else its
        staged bytes at this site's measured rate; None when neither is known or it
        has no staged copy (routing then prefers a peer)."""
        if record.tier != Tier.STAGED:
            return None
        if record.usage.promote_s > 0:
            return record.usage.promote_s
        if self.promote_s_per_byte is None:
            return None
        return record.staged_bytes * self.promote_s_per_byte

    def get(self, name: str, version: str = "") -> ModelRecord | None:
        key = self.serving.get(name)
        if key is None:
            return None
        if version and version != key.version:
            return self.by_key.get(ModelKey(name, version))
        return self.by_key[key]

    def records(self) -> list[ModelRecord]:
        """The served version of every model, by name."""
        return [self.by_key[k] for k in sorted(self.serving.values(), key=str)]

    def all_records(self) -> list[ModelRecord]:
        """Every record, older versions still draining included."""
        return list(self.by_key.values())

    def by_str(self, name: str) -> ModelRecord | None:
        return next((r for r in self.by_key.values() if str(r.key) == name), None)

    def device_bytes(self) -> int:
        return sum(r.held_bytes for r in self._holding.values())

    def hot_models(self) -> int:
        return sum(1 for r in self.by_key.values() if r.hot)

    def host_bytes(self) -> int:
        return sum(r.staged_bytes + r.staged_variant_bytes for r in self.by_key.values())

    def leaving_bytes(self) -> int:
        """Bytes of models on their way out (draining or unloading)."""
        leaving = (Phase.DRAINING, Phase.UNLOADING)
        return sum(r.held_bytes for r in self._holding.values() if r.phase in leaving)

    def pinned_bytes(self, besides: ModelRecord | None = None) -> int:
        held = self._holding.values()
        return sum(r.held_bytes for r in held if r.pinned and r is not besides)

    def pending_loads(self) -> int:
        return len(self._queued)

    def queued(self) -> list[ModelRecord]:
        """Loads waiting for room, first come first."""
        return sorted(self._queued.values(), key=lambda r: r.queued_at)

    def load_bytes(
        self,
        record: ModelRecord,
        budget: int | None,
        form: str | None = None,
        pinned: int | None = None,
    ) -> int:
        """Bytes to hold for loading `record` as `form`: its estimate, but no more than
        the budget leaves beside the pins (`pinned`: the other models' pinned bytes,
        when the caller has them). An estimate above that is a measurement nothing has
        confirmed yet (ModelRecord.certain_bytes); the load measures again."""
        needed = record.estimate_bytes(form)
        if budget is None:
            return needed
        if pinned is None:
            pinned = self.pinned_bytes(besides=record)
        return max(1, min(needed, budget - pinned))

    def queued_loads(self, budget: int | None) -> list[QueuedLoad]:
        """The planner's view of the loads waiting for room, first come first: each as
        shipped, and as its smaller variant where it accepts one."""
        queued = self.queued()
        # A queued model holds nothing, so the pins beside it are all the pins.
        pinned = self.pinned_bytes() if queued and budget is not None else 0
        loads = []
        for record in queued:
            smaller = record.smaller_form() if record.variants else None
            loads.append(
                QueuedLoad(
                    record.key,
                    self.load_bytes(record, budget, ORIGINAL, pinned),
                    record.certain_bytes(ORIGINAL),
                    None
                    if smaller is None
                    else (
                        smaller,
                        self.load_bytes(record, budget, smaller, pinned),
                        record.certain_bytes(smaller),
                    ),
                    # Asked for by a request alone: neither placed here nor loaded
                    # by placement or the operator.
                    beside_plan=not (record.placed or record.explicit),
                )
            )
        return loads

    def fits_without_eviction(self, name: str, budget: int | None) -> bool:
        record = self.get(name)
        if record is None or budget is None:
            return True
        return self.device_bytes() + record.estimate_bytes() <= budget

    def slot(self, record: ModelRecord) -> Slot:
        """The planner's view of `record`."""
        return Slot(
            key=record.key,
            phase=record.phase,
            held=record.held_bytes,
            leases=record.leases,
            pinned=record.pinned,
            placed=record.placed,
            in_sequence=record.holds > 0,
            hot=record.hot,
            priority=record.source.config.priority if record.source.config else 0,
            last_used=record.usage.last_used,
            frequency=record.usage.frequency,
            credit=record.usage.credit,
            promote_s=record.usage.promote_s + record.usage.setup_s,
            leaving=record.device_bytes if record.chore == Chore.REFORM else 0,
            **self._smaller(record),
        )

    @staticmethod
    def _smaller(record: ModelRecord) -> dict[str, Any]:
        """A serving original's smaller usable variant, for the planner to swap to."""
        if not record.variants or record.phase != Phase.READY or record.form or record.chore:
            return {}
        form = record.smaller_form()
        if form is None:
            return {}
        return {"smaller": record.estimate_bytes(form), "smaller_form": form}

    def slots(self, besides: ModelRecord | None = None) -> list[Slot]:
        """The models that hold device memory (a session or a reservation): the rest
        of a catalog many times the budget is nothing the planner can move or count."""
        return [self.slot(r) for r in self._holding.values() if r is not besides]

    def candidates(self) -> list[Candidate]:
        """The serving models, as eviction policies see them."""
        return [candidate(self.slot(r)) for r in self.by_key.values() if r.phase == Phase.READY]

    def idle_staged(self) -> list[ModelRecord]:
        """Staged copies of models that are not loaded, least recently used first."""
        idle = (
            r
            for r in self.by_key.values()
            if r.staged_bytes and r.phase in (Phase.ABSENT, Phase.FAILED)
        )
        return sorted(idle, key=lambda r: r.usage.last_used)
