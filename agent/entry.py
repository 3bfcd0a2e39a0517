"""One model in the model table: its state, tier and bookkeeping.

Only the model table (models.py, upkeep.py) writes these fields, on the
agent's event loop; front doors and status read them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum

from edgeplex.agent import ipc
from edgeplex.agent.batcher import Batcher
from edgeplex.agent.config import ModelConfig
from edgeplex.agent.errors import ModelFailed
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.repository import ModelSource
from edgeplex.agent.stats import ModelStats
from edgeplex.agent.tensors import ORT_TO_OIP, TensorSpec

DEFAULT_MAX_BATCH_SIZE = 8
SHARED_RUNNER = "shared-0"
# Before a model's first load its memory is unknown: assume its file size times this.
FIRST_LOAD_ESTIMATE = 1.05
PROMOTION_GRACE_S = 1.0  # a model this freshly promoted is evicted only as a last resort
FREQUENCY_HALF_LIFE_S = 30.0
# How long a load waits for other loads and demotions to free device memory before
# it fails with RESOURCE_EXHAUSTED (requests stop waiting at their own deadline).
ROOM_WAIT_S = 30.0


class ModelState(StrEnum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


class Tier(StrEnum):
    LOADED = "loaded"
    STAGED = "staged"
    CACHED = "cached"


@dataclass(eq=False)
class ModelEntry:
    source: ModelSource
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int = 0
    memory_bytes: int = 0  # measured device bytes of the live session (0 when none)
    reserved_bytes: int = 0  # device bytes held for a load in progress
    staged_bytes: int = 0  # host bytes of the staged copy (0 when not staged)
    load_ms: float = 0.0
    promote_ms: float = 0.0  # last staged -> loaded promotion
    stages: dict[str, float] = field(default_factory=dict)
    last_source: str = ""
    generation: int = 0
    load_crashes: int = 0
    reload_when_runner_up: bool = False
    load_after_unload: bool = False
    drop_staged_after_unload: bool = False
    disabled: bool = False  # OIP unload: not served until an explicit load
    scaling: bool = False  # a SetInstances is in flight
    waiting_for_room: bool = False  # a load waits for memory held by loads in flight
    fast_load: bool = False  # next load: skip prepacking (promotion on demand)
    prepacked: bool = False  # the live session has prepacked weights
    upgrading: bool = False  # a Prepack is in flight
    loaded_at: float = 0.0
    pinned: bool = False
    last_used: float = 0.0
    frequency: float = 0.0
    credit: float = 0.0
    batcher: Batcher | None = None
    stats: ModelStats = field(default_factory=ModelStats)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    unloaded: asyncio.Event = field(default_factory=asyncio.Event)
    last_measured: int = 0  # device bytes the last session measured

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def version(self) -> str:
        return self.source.version

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
        if self.state == ModelState.READY:
            return Tier.LOADED
        return Tier.STAGED if self.staged_bytes else Tier.CACHED

    def estimate_bytes(self) -> int:
        if self.memory_bytes:
            return self.memory_bytes
        if self.last_measured:
            return self.last_measured
        try:
            size = self.source.path.stat().st_size
        except OSError:
            size = 0
        return int(size * FIRST_LOAD_ESTIMATE)


def record_promotion(entry: ModelEntry, reply: ipc.ModelLoaded) -> None:
    """Stages, source and staged bytes of the promotion that just finished."""
    entry.stages = {k: round(v, 3) for k, v in reply.stages.items()}
    entry.last_source = reply.source
    entry.staged_bytes = reply.staged_bytes
    if reply.source == "staged":
        entry.promote_ms = reply.load_ms
    else:
        entry.promote_ms = reply.stages.get("create", 0) + reply.stages.get("warmup", 0)
    METRICS.promotions.labels(source=reply.source).inc()
    METRICS.promotion_duration.labels(source=reply.source).observe(reply.load_ms / 1000)
    for stage, ms in reply.stages.items():
        METRICS.promotion_stage_duration.labels(stage=stage).observe(ms / 1000)
    METRICS.model_memory.labels(model=entry.name).set(entry.memory_bytes)


def apply_metadata(entry: ModelEntry, reply: ipc.ModelLoaded) -> None:
    """Inputs, outputs, batching and measured memory from a load's reply; raises
    ModelFailed when the model cannot be served as configured."""

    def specs(items: list[list]) -> list[TensorSpec]:
        out = []
        for name, ort_type, shape in items:
            datatype = ORT_TO_OIP.get(ort_type)
            if datatype is None or datatype in ("BYTES", "BF16"):
                raise ModelFailed(f"tensor '{name}' has type {ort_type}, not supported")
            out.append(TensorSpec(name, datatype, tuple(shape)))
        return out

    inputs, outputs = specs(reply.inputs), specs(reply.outputs)
    batchable = all(t.shape and t.shape[0] == -1 for t in inputs + outputs)
    wanted = entry.config.max_batch_size
    if wanted is None:
        max_batch = DEFAULT_MAX_BATCH_SIZE if batchable else 0
    elif wanted > 0 and not batchable:
        raise ModelFailed(
            f"max_batch_size {wanted} needs a dynamic leading dimension on every input"
            " and output, and this model has none"
        )
    else:
        max_batch = wanted
    entry.inputs, entry.outputs, entry.max_batch_size = inputs, outputs, max_batch
    entry.memory_bytes, entry.load_ms = max(reply.bytes, 1), reply.load_ms
    entry.last_measured = entry.memory_bytes
