"""The residency table: every model's record, the version each name serves,
and the questions asked of them (bytes per tier, queued loads, the planner's
snapshot).

The owner (owner.py) is its only writer; everything here reads.
"""

from __future__ import annotations

from edgeplex.agent.residency.planner import Slot, candidate
from edgeplex.agent.residency.policies import Candidate
from edgeplex.agent.residency.state import ModelKey, ModelRecord, Phase


class Ledger:
    def __init__(self) -> None:
        self.by_key: dict[ModelKey, ModelRecord] = {}
        self.serving: dict[str, ModelKey] = {}  # name -> the version requests reach

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
        return sum(r.held_bytes for r in self.by_key.values())

    def host_bytes(self) -> int:
        return sum(r.staged_bytes for r in self.by_key.values())

    def leaving_bytes(self) -> int:
        """Bytes of models on their way out (draining or unloading)."""
        leaving = (Phase.DRAINING, Phase.UNLOADING)
        return sum(r.held_bytes for r in self.by_key.values() if r.phase in leaving)

    def pinned_bytes(self, besides: ModelRecord | None = None) -> int:
        return sum(r.held_bytes for r in self.by_key.values() if r.pinned and r is not besides)

    def pending_loads(self) -> int:
        return sum(1 for r in self.by_key.values() if r.phase == Phase.QUEUED)

    def queued(self) -> list[ModelRecord]:
        """Loads waiting for room, first come first."""
        waiting = (r for r in self.by_key.values() if r.phase == Phase.QUEUED)
        return sorted(waiting, key=lambda r: r.queued_at)

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
            priority=record.source.config.priority if record.source.config else 0,
            last_used=record.usage.last_used,
            frequency=record.usage.frequency,
            credit=record.usage.credit,
            promote_s=record.usage.promote_s,
        )

    def slots(self, besides: ModelRecord | None = None) -> list[Slot]:
        return [self.slot(r) for r in self.by_key.values() if r is not besides]

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
