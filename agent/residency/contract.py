"""What the residency owner and its surroundings exchange: the effects it asks
for, the queues those effects drive, the limits it keeps, and what a finished
load reports.

`Effects` is implemented by `effects.RunnerEffects` (runner processes) and by
the tests' fake sink; every effect reports back through an owner event.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from edgeplex.agent.oip.errors import ServeError
from edgeplex.agent.residency.state import ModelRecord


class Effects(Protocol):
    """Slow work the owner starts; each reports back through an owner event."""

    def load(self, record: ModelRecord, generation: int, fast: bool) -> None: ...
    def unload(self, record: ModelRecord, generation: int) -> None: ...
    def serve(self, record: ModelRecord) -> None: ...  # open or resume its queue
    def pause(self, record: ModelRecord) -> None: ...  # its runner is gone: hold the queue
    def stage(self, record: ModelRecord, form: str = "") -> None: ...
    def drop_staged(self, record: ModelRecord) -> None: ...
    def prepack(self, record: ModelRecord, generation: int) -> None: ...
    def queue_load(self, record: ModelRecord) -> QueueLoad | None: ...  # None: no queue
    def scale(self, record: ModelRecord, instances: int) -> None: ...  # -> side.scaled
    def build_variants(self, record: ModelRecord, forms: list[str]) -> None: ...
    def reform(self, record: ModelRecord, generation: int, form: str) -> None: ...  # swap


class Queue(Protocol):
    """A serving model's queue, as the effects read it."""

    @property
    def depth(self) -> int: ...
    @property
    def instances(self) -> int: ...
    @property
    def last_queued(self) -> float: ...  # time.monotonic() it last held a request


class Queues(Protocol):
    """Every serving model's queue (batching/queues.py): what the effects open, hold,
    resize and close as the owner decides."""

    def get(self, key: Hashable) -> Queue | None: ...
    def open(self, model: ModelRecord, source: object, instances: int) -> None: ...
    def hold(self, key: Hashable, name: str) -> None: ...
    def set_instances(self, key: Hashable, name: str, instances: int) -> None: ...
    def close(self, key: Hashable, error: ServeError, drain: bool) -> None: ...
    async def closed(self, key: Hashable, error: ServeError) -> None: ...


@dataclass(frozen=True)
class QueueLoad:
    """What a serving model's queue holds now (the scaling decision reads it)."""

    depth: int
    instances: int
    idle_s: float  # since the queue was last non-empty


@dataclass(frozen=True)
class Limits:
    device_budget: int | None = None
    host_budget: int | None = None
    max_pending_loads: int = 16  # promotions waiting for room before requests are refused
    max_promotions: int = 4  # loads in flight (or promised room) at once
    prepack: bool = False
    prepack_after_s: float = 2.0
    hot_share: float = 0.5  # of the budget, kept for the most requested models (hot_set.py)
    sequence_drain_s: float = 120.0  # placement's demote waits this long for live sequences


@dataclass(frozen=True)
class Loaded:
    """What a finished load reports."""

    bytes: int
    promote_s: float
    staged_bytes: int
    prepacked: bool
    source: str  # the tier it came from
    # Made as a promotion on demand makes it (no warm-up, no prepacking): its time is
    # what bringing the model back costs. A load for placement or an admin does more.
    on_demand: bool = True
