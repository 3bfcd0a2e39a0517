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

A model is identified by (name, version): several versions are separate records
that share nothing but their name. Its forms (the one it ships as, and quantized
variants built of it) are not: a record's session holds one form at a time
(`form`), chosen when it loads and swapped in place by the runner, so a model
keeps one queue and one lease count whatever form serves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from edgeplex.agent.catalog.forms import ORIGINAL, VariantReport
from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.catalog.repository import ModelSource
from edgeplex.agent.oip.tensors import TensorSpec

if TYPE_CHECKING:  # tickets.py imports this module
    from edgeplex.agent.residency.tickets import Ticket

DEFAULT_MAX_BATCH_SIZE = 8
# Before a model's first load its memory is unknown: assume its file size times this.
FIRST_LOAD_ESTIMATE = 1.05
# A model is refused as too big for the budget only when this many measurements of
# its session say so: a runner's memory also grows by what its other sessions
# allocate meanwhile, so one sample may count a neighbour's bytes.
MEASURES_KEPT = 2


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


class Chore(StrEnum):
    """Background work in flight on a model beside its phase (one at a time); NONE is
    falsy, so `not record.chore` reads "nothing in flight"."""

    NONE = ""
    STAGE = "stage"  # a staged copy being written (or a variant's)
    SCALE = "scale"  # its instances being changed
    PREPACK_WAIT = "prepack-wait"  # a prepacked rebuild waiting for room
    PREPACK = "prepack"  # a prepacked rebuild beside the serving session
    VARIANTS = "variants"  # its variants being built
    REFORM = "reform"  # swapping to another form beside the serving session

    @property
    def prepacking(self) -> bool:
        return self in (Chore.PREPACK_WAIT, Chore.PREPACK)


class Tier(StrEnum):
    LOADED = "loaded"
    STAGED = "staged"
    CACHED = "cached"


class ModelKey(NamedTuple):  # a tuple: hashed and compared in C, on every plan
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(slots=True)
class Usage:
    """What eviction weighs: recency, decayed frequency, the policy's credit stamp,
    and the cost of bringing the model back."""

    last_used: float = 0.0
    frequency: float = 0.0
    credit: float = 0.0
    loaded_at: float = 0.0
    promote_s: float = 0.0
    # A load for placement or an admin (warmed up, maybe prepacked): its time, more
    # than a promotion on demand, is lost with the session, so part of what evicting
    # it costs, though not of how fast the model comes back.
    setup_s: float = 0.0


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
    staged_variant_bytes: int = 0  # host bytes of its variants' staged copies
    # Its sessions' last MEASURES_KEPT measurements, per form.
    measured: dict[str, tuple[int, ...]] = field(default_factory=dict)
    form: str = ORIGINAL  # the form its session holds, or its load in flight brings
    variants: dict[str, VariantReport] = field(default_factory=dict)  # built, usable or not
    leases: int = 0  # admitted requests on a serving model, until their response
    waiters: list[Ticket] = field(default_factory=list)  # tickets waiting for READY
    pinned: bool = False
    # The control plane's desired state loads it at this site: a load of a model it
    # does not place takes no room from it (planner.plan_room).
    placed: bool = False
    # Live sequences of a stateful model (agent/batching/sequences.py): while any
    # hold it, a serving model is neither a victim nor swapped to a smaller form.
    holds: int = 0
    # Placement demoted it while it served and sequences held it: it leaves when
    # they end, or at this clock time (Residency.demote); inf: no such demote waits.
    leave_by: float = float("inf")
    hot: bool = False  # kept against promotions by this site's demand (hot_set.py)
    # Told of every phase change: the ledger's index of models by phase.
    watch: Callable[[ModelRecord], None] | None = field(default=None, repr=False)
    disabled: bool = False  # OIP unload: served again only after an explicit load
    explicit: bool = False  # the queued load was asked for (admin, placement), not a request
    load_crashes: int = 0
    prepacked: bool = False
    chore: Chore = Chore.NONE
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

    def measure(self, size: int) -> None:
        """A measurement of the live session's bytes (of its current form)."""
        self.device_bytes = max(1, size)
        kept = (*self.measured.get(self.form, ()), self.device_bytes)
        self.measured[self.form] = kept[-MEASURES_KEPT:]

    def estimate_bytes(self, form: str | None = None) -> int:
        """Bytes a session of `form` (default: its current one) will likely hold: the
        smallest recent measurement (noise only ever adds bytes), or its file size
        before the first load."""
        form = self.form if form is None else form
        if self.device_bytes and form == self.form:
            return self.device_bytes
        if self.measured.get(form):
            return min(self.measured[form])
        return self._file_estimate(form)

    def certain_bytes(self, form: str | None = None) -> int:
        """Bytes a load of it surely needs: what refusing it as one that can never fit
        goes by. Until MEASURES_KEPT measurements agree, no more than its file."""
        form = self.form if form is None else form
        if len(self.measured.get(form, ())) >= MEASURES_KEPT:
            return min(self.measured[form])
        return min(self.estimate_bytes(form), self._file_estimate(form))

    def smaller_form(self) -> str | None:
        """The usable variant that holds the fewest bytes, when the model accepts
        variants (`quality: any`) and one is smaller than the original."""
        if self.source.config is None or self.config.quality != "any":
            return None
        usable = [f for f, v in self.variants.items() if v.usable]
        best = min(usable, key=self.estimate_bytes, default=None)
        if best is None or self.estimate_bytes(best) >= self.estimate_bytes(ORIGINAL):
            return None
        return best

    def form_path(self, form: str | None = None) -> Path:
        form = self.form if form is None else form
        return Path(self.variants[form].path) if form else self.source.path

    def _file_estimate(self, form: str) -> int:
        if form:  # its report has the size: no stat on the planner's path
            size = self.variants[form].file_bytes if form in self.variants else 0
        else:
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
        if phase is not Phase.READY:
            self.leave_by = float("inf")  # a wait for sequences ends as it stops serving
        if self.watch is not None:
            self.watch(self)

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
