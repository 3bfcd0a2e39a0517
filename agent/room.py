"""Device memory for loads: eviction through the policy, waiting for memory that
loads and demotions in flight will release, and the host budget of the staged
tier.

Methods of ModelTable (it inherits this class), split out of models.py for
size; the table's ownership rules hold (event loop only, no await between
reading and writing an entry).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeplex.agent.config import AgentSettings
from edgeplex.agent.entry import (
    FREQUENCY_HALF_LIFE_S,
    PROMOTION_GRACE_S,
    ROOM_WAIT_S,
    ModelEntry,
    ModelState,
    Tier,
)
from edgeplex.agent.errors import NoRoom
from edgeplex.agent.eviction import Candidate, EvictionPolicy, GreedyDualSizeFrequency
from edgeplex.agent.runners import RunnerPool


class TableRoom:
    _entries: dict[str, ModelEntry]
    _settings: AgentSettings
    _pool: RunnerPool
    _room_changed: asyncio.Event
    policy: EvictionPolicy

    if TYPE_CHECKING:  # provided by ModelTable

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
        def device_bytes(self) -> int: ...
        def host_bytes(self) -> int: ...
        def staged_dir(self, entry: ModelEntry) -> Path: ...
        def _begin_load(self, entry: ModelEntry) -> None: ...
        def _drop_staged(self, entry: ModelEntry) -> None: ...
        def _resolve_waiters(self, entry: ModelEntry, error: Any) -> None: ...
        def demote(self, name: str, tier: Tier, reason: str = ...) -> asyncio.Future[None]: ...

    def _fits_someday(self, needed: int) -> bool:
        """Whether `needed` bytes would fit once loads and demotions in flight settle:
        the policy evicts on demand (gdsf, lru) and the pinned models leave room."""
        if self.policy.name not in ("gdsf", "lru"):
            return False  # ttl and none refuse rather than wait
        budget = self._settings.device_memory_budget
        if budget is None:
            return True
        pinned = sum(e.memory_bytes for e in self._entries.values() if e.pinned)
        return needed <= budget - pinned

    async def _retry_when_room(self, entry: ModelEntry, error: NoRoom) -> None:
        deadline = time.monotonic() + ROOM_WAIT_S
        while time.monotonic() < deadline:
            self._room_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room_changed.wait(), deadline - time.monotonic())
            if not entry.waiters or entry.state != ModelState.UNAVAILABLE:
                break
            if self._can_start(entry):
                self._begin_load(entry)  # clears waiting_for_room when the load starts
                if not entry.waiting_for_room:
                    return
        entry.waiting_for_room = False
        if entry.state == ModelState.UNAVAILABLE:
            self._resolve_waiters(entry, error)

    def _can_start(self, entry: ModelEntry) -> bool:
        """True when a load of `entry` would find victims (or room) now."""
        needed = entry.estimate_bytes()
        budget = self._settings.device_memory_budget
        if budget is None:
            return True
        others = self.device_bytes() - entry.reserved_bytes - entry.memory_bytes
        missing = others + needed - budget
        if missing <= 0:
            return True
        movable = sum(c.bytes for c in self._candidates(exclude=entry) if not c.pinned)
        return movable >= missing

    def _candidates(self, exclude: ModelEntry | None) -> list[Candidate]:
        # A model promoted moments ago counts as busy: the requests that waited for
        # it are on their way to its queue. Evicting it now (GDSF ranks a newcomer
        # lowest) would send them back to another promotion, and under load the
        # table thrashes.
        fresh = time.monotonic() - PROMOTION_GRACE_S
        return [
            Candidate(
                name=e.name,
                bytes=e.memory_bytes,
                promote_s=(e.promote_ms or e.load_ms) / 1000,
                last_used=e.last_used,
                frequency=e.frequency,
                priority=e.source.config.priority if e.source.config else 0,
                pinned=e.pinned,
                in_flight=(e.batcher.load if e.batcher else 0) + (e.loaded_at > fresh),
                credit=e.credit,
            )
            for e in self._entries.values()
            if e is not exclude and e.state == ModelState.READY
        ]

    def _make_room(
        self, entry: ModelEntry, needed: int, loaded_only: bool = False
    ) -> list[asyncio.Event]:
        """Demote victims so that `needed` more device bytes fit; returns the events to
        wait for. Raises NoRoom when even every evictable model would not do.
        `loaded_only`: count only the sessions that serve (READY), not the memory of
        loads and demotions in flight, which settle by themselves when they end."""
        budget = self._settings.device_memory_budget
        count_based = self.policy.name == "lru"
        if budget is None and not count_based:
            return []
        loaded = sum(
            1
            for e in self._entries.values()
            if e.state in (ModelState.READY, ModelState.LOADING) and e is not entry
        )
        if loaded_only:
            others = sum(
                e.memory_bytes
                for e in self._entries.values()
                if e.state == ModelState.READY and e is not entry
            )
        else:
            others = self.device_bytes() - entry.reserved_bytes - entry.memory_bytes
        missing = 0 if budget is None else others + needed - budget
        if missing <= 0 and not count_based:
            return []
        candidates = self._candidates(exclude=entry)
        victims = self.policy.choose(candidates, max(0, missing), loaded, time.monotonic())
        if victims is None:
            evictable = sum(c.bytes for c in candidates if not c.pinned)
            free = (budget or 0) - self.device_bytes()
            raise NoRoom(
                f"model '{entry.name}' needs {needed} bytes of device memory; {max(free, 0)} "
                f"are free and {evictable} could be freed by eviction "
                f"(budget {budget}, policy {self.policy.name})"
            )
        events = []
        for victim in victims:
            victim_entry = self._entries[victim.name]
            victim_entry.unloaded.clear()
            self.demote(victim.name, Tier.STAGED, reason="evicted")
            events.append(victim_entry.unloaded)
        return events

    def _enforce_host_budget(self) -> None:
        budget = self._settings.host_memory_budget
        if budget is None:
            return
        idle = sorted(
            (
                e
                for e in self._entries.values()
                if e.staged_bytes and e.state in (ModelState.UNAVAILABLE, ModelState.FAILED)
            ),
            key=lambda e: e.last_used,
        )
        for entry in idle:
            if self.host_bytes() <= budget:
                return
            self._drop_staged(entry)

    # --- helpers ----------------------------------------------------------------------------

    def fits_without_eviction(self, name: str) -> bool:
        budget = self._settings.device_memory_budget
        entry = self._entries[name]
        return budget is None or self.device_bytes() + entry.estimate_bytes() <= budget

    def touch(self, entry: ModelEntry) -> None:
        """Record a request for `entry` (recency, GDSF credit, and a frequency that
        halves every FREQUENCY_HALF_LIFE_S, so demand that moved away stops counting)."""
        now = time.monotonic()
        if entry.last_used:
            entry.frequency *= 0.5 ** ((now - entry.last_used) / FREQUENCY_HALF_LIFE_S)
        entry.last_used = now
        entry.frequency += 1
        if isinstance(self.policy, GreedyDualSizeFrequency):
            entry.credit = self.policy.clock
