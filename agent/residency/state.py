"""The state of one model in residency: its lifecycle phase, its one pending
intent, its bytes per tier, its leases and what eviction needs to know.

Only the owner (owner.py) writes these records, on the agent's event loop;
everything else reads them. A phase changes only through `ModelRecord.enter`,
which checks the move against TRANSITIONS, so the table below is the whole
lifecycle:

    ABSENT ──want──▶ QUEUED ──room──▶ LOADING ──ok──▶ READY ──victim with leases──▶ DRAINING
      ▲                │                │  │            │                               │
      │       never fits, nobody waits  │  │ runner     │ victim without leases         │ last lease
      │                ▼           fail ▼  │ lost       ▼                               │ ends
      │             ABSENT          FAILED │         UNLOADING ◀──────────────────────────┘
      │                                    ▼
      │                               RECOVERING ──runner up──▶ LOADING
      └────────────────────── unloaded ◀── UNLOADING

(READY and DRAINING models also go to RECOVERING when their runner dies.)

A model is identified by (name, version, variant): several versions, and later
several forms of one version (quantized variants), are separate records that
share nothing but their name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from edgeplex.agent.config import ModelConfig
from edgeplex.agent.repository import ModelSource
from edgeplex.agent.tensors import TensorSpec

if TYPE_CHECKING:  # tickets.py imports this module
    from edgeplex.agent.residency.tickets import Ticket

DEFAULT_MAX_BATCH_SIZE = 8
# Before a model's first load its memory is unknown: assume its file size times this.
FIRST_LOAD_ESTIMATE = 1.05


class Phase(StrEnum):
    ABSENT = "absent"  # no session: the model is staged or cached
    QUEUED = "queued"  # a load is wanted and waits for device memory
    LOADING = "loading"  # a load is in flight; its bytes are reserved
    READY = "ready"  # serving; admits requests
    DRAINING = "draining"  # chosen as a victim: serves its leases, admits none
    UNLOADING = "unloading"  # its session is being dropped
    RECOVERING = "recovering"  # its runner died; reloaded when the runner is back
    FAILED = "failed"  # cannot load as configured; `reason` says why


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.ABSENT: frozenset({Phase.QUEUED, Phase.FAILED}),
    Phase.QUEUED: frozenset({Phase.LOADING, Phase.ABSENT, Phase.FAILED}),
    Phase.LOADING: frozenset({Phase.READY, Phase.FAILED, Phase.RECOVERING, Phase.UNLOADING}),
    Phase.READY: frozenset({Phase.DRAINING, Phase.UNLOADING, Phase.RECOVERING}),
    Phase.DRAINING: frozenset({Phase.UNLOADING, Phase.RECOVERING}),
    Phase.UNLOADING: frozenset({Phase.ABSENT}),
    Phase.RECOVERING: frozenset({Phase.LOADING, Phase.FAILED, Phase.UNLOADING}),
    Phase.FAILED: frozenset({Phase.QUEUED, Phase.ABSENT}),
}

# Phases whose session (or reservation) holds device memory.
HOLDS_DEVICE = frozenset(
    {Phase.LOADING, Phase.READY, Phase.DRAINING, Phase.UNLOADING, Phase.RECOVERING}
)


class Intent(StrEnum):
    """What the owner does once the phase in progress settles (one at a time)."""

    NONE = "none"
    SERVE = "serve"  # load again after the unload in progress (new version, re-admits)
    STAGED = "staged"  # demote to staged once drained
    CACHED = "cached"  # demote to cached (drop the staged copy) once drained
    RETIRE = "retire"  # an older version: drop it entirely once drained


class Tier(StrEnum):
    LOADED = "loaded"
    STAGED = "staged"
    CACHED = "cached"


@dataclass(frozen=True, slots=True)
class ModelKey:
    name: str
    version: str
    variant: str = ""  # "" is the model as published; quantized forms get a name

    def __str__(self) -> str:
        return f"{self.name}:{self.version}{'/' + self.variant if self.variant else ''}"


@dataclass(slots=True)
class Usage:
    """What eviction weighs: recency, decayed frequency, the policy's credit stamp,
    and the cost of bringing the model back."""

    last_used: float = 0.0
    frequency: float = 0.0
    credit: float = 0.0
    loaded_at: float = 0.0
    promote_s: float = 0.0


@dataclass(eq=False)
class ModelRecord:
    key: ModelKey
    source: ModelSource
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    max_batch_size: int = 0
    phase: Phase = Phase.ABSENT
    intent: Intent = Intent.NONE
    reason: str = ""
    generation: int = 0  # bumped on every load/unload; stale results are ignored
    device_bytes: int = 0  # measured bytes of the live session
    reserved_bytes: int = 0  # bytes held for a load in flight
    staged_bytes: int = 0  # host bytes of the staged copy
    last_measured: int = 0
    leases: int = 0  # admitted requests on a serving model, until their response
    waiters: list[Ticket] = field(default_factory=list)  # tickets waiting for READY
    pinned: bool = False
    disabled: bool = False  # OIP unload: served again only after an explicit load
    explicit: bool = False  # the queued load was asked for (admin, placement), not a request
    load_crashes: int = 0
    prepacked: bool = False
    side_work: str = ""  # "scale" | "prepack" | "stage" while one is in flight
    usage: Usage = field(default_factory=Usage)
    queued_at: int = 0  # order among queued loads (FIFO)

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def version(self) -> str:
        return self.key.version

    @property
    def config(self) -> ModelConfig:
        assert self.source.config is not None
        return self.source.config

    @property
    def runner_id(self) -> str:
        if self.source.config is not None and self.source.config.isolation == "dedicated":
            return f"dedicated-{self.name}"
        return SHARED_RUNNER

    @property
    def tier(self) -> Tier:
        if self.phase in (Phase.READY, Phase.DRAINING):
            return Tier.LOADED
        return Tier.STAGED if self.staged_bytes else Tier.CACHED

    @property
    def held_bytes(self) -> int:
        """Device bytes this model holds now (a live session or a reservation)."""
        if self.phase not in HOLDS_DEVICE:
            return 0
        return max(self.device_bytes, self.reserved_bytes)

    def estimate_bytes(self) -> int:
        if self.device_bytes:
            return self.device_bytes
        if self.last_measured:
            return self.last_measured
        try:
            size = self.source.path.stat().st_size
        except OSError:
            size = 0
        return max(1, int(size * FIRST_LOAD_ESTIMATE))

    def enter(self, phase: Phase) -> None:
        """The only way a phase changes; an illegal move is a bug, raised loudly."""
        if phase is not self.phase and phase not in TRANSITIONS[self.phase]:
            raise AssertionError(f"{self.key}: illegal move {self.phase} -> {phase}")
        self.phase = phase

    def public_state(self) -> str:
        """The OIP repository index's state names."""
        return {
            Phase.ABSENT: "UNAVAILABLE",
            Phase.QUEUED: "LOADING",
            Phase.LOADING: "LOADING",
            Phase.READY: "READY",
            Phase.DRAINING: "READY",
            Phase.UNLOADING: "UNLOADING",
            Phase.RECOVERING: "LOADING",
            Phase.FAILED: "FAILED",
        }[self.phase]


SHARED_RUNNER = "shared-0"
