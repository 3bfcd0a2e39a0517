"""How one model is served (`<repo>/<model>/config.yaml`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgeplex.agent.catalog.forms import Calibration, Form, VariantGuard
from edgeplex.sizes import parse_size

TimeoutAction = Literal["reject", "delay"]


def check_resources(counts: dict[str, int]) -> dict[str, int]:
    """Rate limiter resources as a model asks for them or the agent counts them: named
    (1 to 64 printable characters), at least one of each."""
    for name, count in counts.items():
        if not 1 <= len(name) <= 64 or not name.isprintable():
            raise ValueError(f"a rate limiter resource name must be 1 to 64 printable "
                             f"characters, not {name[:80]!r}")  # fmt: skip
        if count < 1:
            raise ValueError(f"rate limiter resource '{name}': count {count} is below 1")
    return counts


class QueuePolicy(NamedTuple):
    """What a request's priority level gives it: its timeout, whether a queued
    request past it is delayed rather than failed, and whether the caller's
    `timeout` parameter may shorten it."""

    timeout_ms: int
    delay: bool
    override: bool


class LevelPolicy(BaseModel):
    """One priority level's own queue policy (Triton's `priority_queue_policy` entry)."""

    model_config = ConfigDict(extra="forbid")

    max_queue_size: int | None = Field(
        default=None,
        ge=1,
        description="Requests of this level that may wait in the queue; one more is refused "
        "as the queue full. Unset: only the model's `max_queue_size` holds.",
    )
    timeout_ms: int | None = Field(
        default=None,
        ge=1,
        description="This level's deadline, in place of the model's `timeout_ms` (a "
        "caller's own timeout still counts when it is sooner).",
    )
    timeout_action: TimeoutAction | None = Field(
        default=None,
        description="This level's `timeout_action`, in place of the model's.",
    )
    allow_timeout_override: bool | None = Field(
        default=None,
        description="This level's `allow_timeout_override`, in place of the model's.",
    )


class ModelConfig(BaseModel):
    """`<repo>/<model>/config.yaml`: how one model is served. Every field is optional."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int | None = Field(
        default=None,
        ge=0,
        description="Largest dynamic batch. Unset: 8 when every input and output has a "
        "dynamic leading dimension, else 0. 0 disables batching; a value above 0 on a "
        "model without a dynamic leading dimension is an error.",
    )
    max_queue_delay_us: int = Field(
        default=0,
        ge=0,
        description="How long the batcher may hold a request waiting for more to join its "
        "batch. 0: batch only what is already queued when the model is free.",
    )
    preferred_batch_sizes: list[int] = Field(
        default=[],
        description="Batch sizes to send as soon as the queue can fill one, without waiting "
        "out `max_queue_delay_us` (Triton's `preferred_batch_size`): the largest it can fill. "
        "A batch that fills none waits for the delay, then takes what is queued. Each at "
        "most `max_batch_size`.",
    )
    priority_levels: int = Field(
        default=0,
        ge=0,
        description="Priority levels of this model's queue (Triton's `priority_levels`): a "
        "request's `priority` parameter, 1 the highest, serves it before every queued request "
        "of a lower level; 0, or a level above this count, means `default_priority_level`. "
        "0: one level, and the parameter is ignored.",
    )
    default_priority_level: int = Field(
        default=0,
        ge=0,
        description="The level of a request that names none (Triton's "
        "`default_priority_level`); with `priority_levels`, from 1 to it.",
    )
    priority_queue_policy: dict[int, LevelPolicy] = Field(
        default={},
        description="Queue policies of single priority levels (Triton's "
        "`priority_queue_policy`), by level, from 1 to `priority_levels`: a level's own cap "
        "on waiting requests and its own timeout.",
    )
    response_cache: bool = Field(
        default=False,
        description="Answer a request the same as an earlier one from the agent's response "
        "cache (`response_cache_bytes`), without running or promoting the model (Triton's "
        "`response_cache { enable: true }`). For models whose answers depend on their "
        "inputs alone; not for stateful models.",
    )
    max_queue_size: int = Field(
        default=256,
        ge=1,
        description="Requests that may wait in this model's queue; beyond it clients get "
        "RESOURCE_EXHAUSTED / HTTP 429 with Retry-After. For a stateful model, also the "
        "sequence STARTs that may wait for a free sequence slot.",
    )
    timeout_ms: int = Field(
        default=30_000,
        ge=1,
        description="Default per-request time limit, queueing included. A request's own "
        "deadline (gRPC deadline or the `timeout` parameter, in microseconds) can shorten it.",
    )
    timeout_action: TimeoutAction = Field(
        default="reject",
        description="What `timeout_ms` does to a request still queued when it runs out "
        "(Triton's `timeout_action`): `reject` fails it with DEADLINE_EXCEEDED; `delay` moves "
        "it behind every request of its priority level still within its timeout, to run when "
        "they have. A delayed request fails at its caller's own deadline, or, when the caller "
        "set none, 30 s after its delay.",
    )
    allow_timeout_override: bool = Field(
        default=True,
        description="Whether a request's `timeout` parameter may shorten `timeout_ms` (Triton's "
        "`allow_timeout_override`, whose default is false; a config.pbtxt queue policy sets "
        "it). A gRPC deadline always counts: past it the caller has gone.",
    )
    execution_timeout_ms: int = Field(
        default=60_000,
        ge=1,
        description="How long one batch may run in the runner. Past it the runner is taken "
        "as hung: it is killed and restarted, and the batch runs once more; lost again, the "
        "batch is split until the request at fault is found and failed alone.",
    )
    instance_count: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Batches of this model that may execute at the same time.",
    )
    max_instances: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Elastic instances: when the queue stays deeper than the running "
        "instances can absorb, add instances (threads over the same session, so no extra "
        "weights) up to this many; back to `instance_count` after `scale_down_idle_s` "
        "without a queue. Unset: fixed at `instance_count`.",
    )
    scale_down_idle_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds without a queue before an elastic model drops its extra instances.",
    )
    rate_limit_resources: dict[str, int] = Field(
        default={},
        description="With the agent's `rate_limit: execution_count`, the resources each "
        "batch of this model holds while it runs, by name (Triton's instance_group "
        "`rate_limiter.resources`): a batch starts only when the agent's pool has them "
        "free. Empty: not limited.",
    )
    rate_limit_priority: int = Field(
        default=1,
        ge=1,
        description="With the agent's `rate_limit: execution_count`, this model's weight "
        "among models waiting for resources (Triton's `rate_limiter.priority`): one of "
        "priority 2 gets half the turns of one of priority 1.",
    )
    isolation: Literal["shared", "dedicated"] = Field(
        default="shared",
        description="`shared`: the model lives in its device's shared runner. `dedicated`: "
        "it gets a runner process of its own, so a crash there touches nothing else.",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="ONNX Runtime intra-op threads for this model; unset: the runner default.",
    )
    priority: int = Field(
        default=0,
        description="Relative importance, higher is more important: loaded first at start and "
        "weighted 2**priority in the eviction cost.",
    )
    pin: bool = Field(
        default=False,
        description="Load the model at start and never evict it (the `pin` verb does the same "
        "at run time).",
    )
    memory_limit: int | None = Field(
        default=None,
        description="Bytes the model may use (size suffixes allowed). With `isolation: "
        "dedicated`, its runner's host memory is capped (cgroup v2, else v1, else "
        "RLIMIT_AS; the agent logs which at start); on CUDA it is also ORT's "
        "`gpu_mem_limit`.",
    )
    device_id: int | None = Field(
        default=None,
        ge=0,
        description="On CUDA, the device this model's sessions run on; unset: "
        "`runner.device_id`. The device budget counts the agent's models on every device "
        "together: run one agent per GPU to budget each.",
    )
    gpu_arena: Literal["same_as_requested", "next_power_of_two"] = Field(
        default="same_as_requested",
        description="On CUDA, how the session's memory arena grows: by what each "
        "allocation asks (the least held) or in powers of two (fewer allocations). The "
        "arena is the session's: a demotion returns it to the device.",
    )

    variants: list[Form] = Field(
        default=[],
        description="Smaller forms to build of this model (`int8`, `fp16`): built once in "
        "the background, checked against the original by `variant_guard`, stored by "
        "content in `variant_dir`. Served only with `quality: any`.",
    )
    quality: Literal["exact", "any"] = Field(
        default="exact",
        description="`exact`: always served as shipped. `any`: when device memory is short, "
        "the model may be loaded as its smallest usable variant rather than evict others, "
        "and goes back to the original when room returns.",
    )
    calibration: Calibration = Field(
        default_factory=Calibration,
        description="The inputs variants are built (static INT8) and checked with.",
    )
    variant_guard: VariantGuard = Field(
        default_factory=VariantGuard,
        description="What a variant must meet on every output, on the calibration inputs, "
        "to be served.",
    )

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _preferred(cls, value: list[int]) -> list[int]:
        if any(size < 1 for size in value):
            raise ValueError("a preferred batch size is at least 1")
        return sorted(set(value))

    @field_validator("rate_limit_resources")
    @classmethod
    def _resources(cls, value: dict[str, int]) -> dict[str, int]:
        return check_resources(value)

    @model_validator(mode="after")
    def _levels(self) -> ModelConfig:
        levels = self.priority_levels
        if levels and not 1 <= self.default_priority_level <= levels:
            raise ValueError(f"default priority level must be in range [1, {levels}]")
        outside = [level for level in self.priority_queue_policy if not 1 <= level <= levels]
        if outside:
            raise ValueError(
                f"priority_queue_policy: level {outside[0]} is not one of the model's "
                f"priority levels (1 to {levels})"
            )
        return self

    def queue_policy(self, level: int) -> QueuePolicy:
        """The queue policy of a request at priority `level`: its level's own where it
        has one, else the model's, field by field (asked once a request)."""
        policy = self.priority_queue_policy.get(level)
        if policy is None:  # most models: no level of their own
            return QueuePolicy(
                self.timeout_ms, self.timeout_action == "delay", self.allow_timeout_override
            )
        action = policy.timeout_action or self.timeout_action
        override = policy.allow_timeout_override
        return QueuePolicy(
            policy.timeout_ms or self.timeout_ms,
            action == "delay",
            self.allow_timeout_override if override is None else override,
        )

    def priority_level(self, asked: int) -> int:
        """The queue level of a request whose `priority` parameter is `asked` (0: none),
        as Triton maps it: a level this model has, else its default."""
        if not self.priority_levels:
            return 0
        return asked if 1 <= asked <= self.priority_levels else self.default_priority_level

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)


def load_model_config(
    path: Path | None, defaults: ModelConfig, base: dict[str, Any] | None = None
) -> ModelConfig:
    """A model's config.yaml laid over `base` (what its config.pbtxt says), laid over
    the agent-wide defaults."""
    merged = defaults.model_dump() | (base or {})
    if path is not None and path.exists():
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError("config.yaml: the top level must be a mapping")
        merged.update(data)
    return ModelConfig(**merged)
