"""Typed configuration of the agent and of each model.

This is the only module that reads the environment. Precedence, highest
first: command-line flags, `EDGEPLEX_AGENT_*` environment variables (nested
fields with `__`, e.g. EDGEPLEX_AGENT_RUNNER__INTRA_OP_THREADS), the YAML file
given with --config, the defaults below. docs/configuration.md documents every
field; tests/agent/test_config.py keeps the two in step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from edgeplex.agent.catalog.forms import Calibration, VariantGuard
from edgeplex.agent.catalog.model_config import ModelConfig, check_resources, load_model_config
from edgeplex.agent.fleet.settings import FleetSettings
from edgeplex.agent.frontdoor.settings import (
    DoorSettings,
    SecuritySettings,
    SharedMemorySettings,
)
from edgeplex.agent.runners.settings import RunnerSettings
from edgeplex.logs import LogFormat
from edgeplex.settings import (
    FileSettings,
    render_tables,
)
from edgeplex.sizes import MiB, parse_size

__all__ = [
    "AgentSettings",
    "DoorSettings",
    "FleetSettings",
    "MiB",
    "ModelConfig",
    "RunnerSettings",
    "SecuritySettings",
    "SharedMemorySettings",
    "load_model_config",
    "load_settings",
    "parse_size",
]


class AgentSettings(FileSettings):
    """Settings of `edgeplex agent`."""

    model_config = SettingsConfigDict(
        env_prefix="EDGEPLEX_AGENT_", env_nested_delimiter="__", extra="forbid"
    )

    model_repo: Path = Field(
        default=Path("models"), description="Triton-layout model repository to serve."
    )
    grpc_host: str = Field(default="127.0.0.1", description="Address of the OIP gRPC server.")
    grpc_port: int = Field(default=8001, ge=0, le=65535, description="OIP gRPC port; 0 = any.")
    http_host: str = Field(default="127.0.0.1", description="Address of the OIP HTTP server.")
    http_port: int = Field(default=8000, ge=0, le=65535, description="OIP HTTP port; 0 = any.")
    metrics_host: str = Field(
        default="127.0.0.1", description="Address of the metrics port (`metrics_port`)."
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="A port serving GET /metrics alone, as Triton's --metrics-port (Prometheus "
        "often scrapes a port of its own); 0 = any. Unset: /metrics is served on the HTTP "
        "port only (it is there either way).",
    )
    max_payload_bytes: int = Field(
        default=64 * MiB,
        description="Largest tensor payload of one request (size suffixes allowed); larger "
        "requests get INVALID_ARGUMENT / HTTP 400 naming the input that crossed it.",
    )
    max_json_bytes: int = Field(
        default=8 * MiB,
        description="Largest JSON part of an HTTP inference request (size suffixes allowed), "
        "well below max_payload_bytes: JSON costs far more to decode than binary tensors. "
        "Send large tensors in the binary extension.",
    )
    max_inflight_requests: int = Field(
        default=1024,
        ge=1,
        description="Inference requests the agent holds at once, across both front doors; "
        "beyond it a request is refused before it is read: RESOURCE_EXHAUSTED / HTTP 429 "
        "with Retry-After.",
    )
    max_inflight_bytes: int = Field(
        default=192 * MiB,
        description="Request bytes the agent holds at once, counted from the declared size "
        "before a body is read and as it decompresses (size suffixes allowed); beyond it, "
        "refused as for max_inflight_requests. The default holds one body of the largest "
        "size (2 x max_payload_bytes + 1 MiB) and keeps the memory a flood of large bodies "
        "can take bounded.",
    )
    response_cache_bytes: int = Field(
        default=64 * MiB,
        description="Room for the response cache (size suffixes allowed), as Triton's "
        "`--cache-config local,size=`: answers of the models whose config enables "
        "`response_cache`, kept by what was asked, least recently used going first. Taken "
        "only as answers are kept; 0 turns the cache off for every model.",
    )
    rate_limit: Literal["off", "execution_count"] = Field(
        default="off",
        description="Triton's --rate-limit. off: a batch runs as soon as its model has a free "
        "instance. execution_count: a batch of a model that names `rate_limit_resources` "
        "runs only while it holds them, from one pool shared by every model; models "
        "waiting for resources take turns by their `rate_limit_priority`.",
    )
    rate_limit_resources: dict[str, int] = Field(
        default={},
        description="Triton's --rate-limit-resource: how many of each resource the pool "
        "holds, by name. A resource not named here holds the most any model asks for; a "
        "model asking for more than a count named here fails, with the reason.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM, how long in-flight requests may take to finish before exit.",
    )
    model_control_mode: Literal["none", "poll", "explicit"] = Field(
        default="none",
        description="Triton's --model-control-mode. none: every model of the repository is "
        "available and loads on demand; load and unload need the admin token. poll: the "
        "same, and the repository is rescanned every `repository_poll_secs` (new, changed "
        "and removed models). explicit: only models loaded (by `load_model` at start or by "
        "a repository load) are available; unload makes a model unavailable until it is "
        "loaded again; load and unload are open to loopback clients and need the admin "
        "token from anywhere else.",
    )
    repository_poll_secs: float = Field(
        default=15.0,
        gt=0,
        description="With model_control_mode: poll, seconds between repository scans "
        "(Triton's --repository-poll-secs).",
    )
    load_model: list[str] = Field(
        default_factory=list,
        description="With model_control_mode: explicit, the models loaded at start ('*': "
        "all), as Triton's --load-model.",
    )
    load_models_at_start: bool = Field(
        default=True,
        description="At start, load the repository's models (pinned first, then by priority) "
        "while they fit the device budget without evicting; the rest stay cached and load "
        "on their first request.",
    )
    prestage: bool = Field(
        default=True,
        description="After start, stage (optimize into host RAM) every model that is not "
        "loaded, within the host budget, so that first requests promote from staged. "
        "Models with `isolation: dedicated` are staged at their first load instead.",
    )
    device_memory_budget: int | None = Field(
        default=None,
        description="Bytes the `loaded` tier may hold (size suffixes allowed), measured per "
        "session. Unset: no limit. On the CPU, device memory is the runners' RAM.",
    )
    host_memory_budget: int | None = Field(
        default=None,
        description="Bytes the `staged` tier (pre-optimized models in host RAM) may hold. "
        "Staged copies of models that are not loaded are dropped, least recently used "
        "first, beyond it. Unset: no limit.",
    )
    disk_cache_budget: int | None = Field(
        default=None,
        description="Bytes of downloaded artifacts kept on local disk (the `cached` tier). "
        "After each reconcile the least recently used ones beyond it are deleted; never one "
        "the desired state names. Unset: no limit.",
    )
    eviction_policy: Literal["gdsf", "lru", "ttl", "none"] = Field(
        default="gdsf",
        description="How victims are chosen when a load needs device memory: `gdsf` "
        "(GreedyDual-Size-Frequency: cost-aware), `lru` (least recently used, at most "
        "`lru_max_models` loaded, as Ray Serve multiplexing), `ttl` (only models idle for "
        "`idle_ttl_s`, as Ollama keep_alive), `none` (no over-commit: refuse what does not "
        "fit).",
    )
    max_pending_loads: int = Field(
        default=16,
        ge=1,
        description="Promotions that may wait for device memory at once. A request for a "
        "model that is not loaded beyond this is refused before admission: "
        "RESOURCE_EXHAUSTED / HTTP 429 with Retry-After.",
    )
    max_promotions: int = Field(
        default=4,
        ge=1,
        description="Promotions in flight (or promised device memory) at once. A runner "
        "creates sessions one after another, so evicting for loads that would wait behind "
        "others only takes memory from serving models early; their victims are chosen when "
        "their turn comes. A few in flight keep the runner's loader busy without a round trip to "
        "the agent between loads (closed-loop 4x: 99.1-99.8% under 50 ms with 4, 95-98.6% "
        "with 2).",
    )
    hot_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of the device budget kept for the most requested models: a "
        "model whose share of recent requests is at least half its share of the budget is "
        "hot, and promotions take room from hot models only when the others cannot make "
        "it (they drain a colder model first). Hot models are rebuilt prepacked first. "
        "0: every serving model is a victim alike.",
    )
    lru_max_models: int = Field(
        default=8, ge=1, description="Most models loaded at once under the `lru` policy."
    )
    idle_ttl_s: float = Field(
        default=300.0,
        gt=0,
        description="Under the `ttl` policy, models idle this long are demoted to staged.",
    )
    sequence_drain_s: float = Field(
        default=120.0,
        ge=0,
        description="In a fleet, how long a stateful model that placement moves away "
        "from this site keeps serving its live sequences here (their state is here) "
        "before it leaves; it leaves as soon as the last one ends. 0: at once.",
    )
    staging_dir: Path | None = Field(
        default=None,
        description="Directory in host RAM (tmpfs) for the staged tier. Unset: a private "
        "directory under /dev/shm, removed at exit.",
    )
    usage_dir: Path | None = Field(
        default=None,
        description="Where usage records (docs/tenants.md) are journaled, one file a "
        "minute, until the control plane has them. Unset: `usage/<site id>` in the state "
        "directory for an agent in a fleet; a standalone agent keeps none unless set.",
    )
    usage_interval_s: int = Field(
        default=60, ge=1, le=3600, description="The period usage records are kept by."
    )
    variant_dir: Path | None = Field(
        default=None,
        description="Content-addressed store of built variants (models' `variants`). "
        "Unset: `.variants` inside the model repository.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level of the agent and its runners."
    )
    log_format: LogFormat = Field(
        default="text",
        description="`text` lines, or `json`: one object per line (time, level, logger, "
        "message) for a log pipeline.",
    )
    access_log_rate: float = Field(
        default=100.0,
        ge=0,
        description="Access log lines a second at most (logger `edgeplex.access`, one per "
        "inference request); above it successes are sampled and failures still written. "
        "0 turns the access log off.",
    )
    grpc_server: Literal["auto", "native", "grpcio"] = Field(
        default="auto",
        description="What serves the OIP gRPC door: `native`, HTTP/2 by libnghttp2 on the "
        "agent's own event loop (built by `make setup`; plaintext only), or `grpcio`'s "
        "asyncio server. auto: native where it is built and gRPC is not served over TLS.",
    )
    http_server: Literal["auto", "native", "aiohttp"] = Field(
        default="auto",
        description="What serves the OIP HTTP door: `native`, HTTP/1.1 parsed by llhttp "
        "(httptools) on the agent's own event loop, or aiohttp's server. Both serve the "
        "same routes and handlers. auto: native where httptools is installed.",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="The front doors' event loop: uvloop (fewer wake-ups and cheaper socket "
        "writes), or the standard library's asyncio. auto: uvloop where it is installed.",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces endpoint (for example http://collector:4318/v1/traces): "
        "each traced inference request is exported as a span with the access log's trace "
        "and span ids: every request at first, or as Triton's trace settings choose "
        "(/v2/trace/setting). Needs the `otel` extra. Unset: no export.",
    )
    runner: RunnerSettings = Field(
        default_factory=RunnerSettings, description="Runner processes (see RunnerSettings)."
    )
    doors: DoorSettings = Field(
        default_factory=DoorSettings,
        description="Deadlines, caps and flood defences of the OIP doors (see DoorSettings).",
    )
    security: SecuritySettings = Field(
        default_factory=SecuritySettings,
        description="Admin token, inference key, TLS (see SecuritySettings).",
    )
    shared_memory: SharedMemorySettings = Field(
        default_factory=SharedMemorySettings,
        description="Triton's system shared memory for local clients (see SharedMemorySettings).",
    )
    fleet: FleetSettings = Field(
        default_factory=FleetSettings,
        description="Fleet membership: control plane, site, region, MQTT (see FleetSettings).",
    )
    model_defaults: ModelConfig = Field(
        default_factory=ModelConfig,
        description="Defaults for every model; a model's config.yaml overrides them field "
        "by field.",
    )

    @field_validator(
        "max_payload_bytes",
        "max_json_bytes",
        "max_inflight_bytes",
        "response_cache_bytes",
        "device_memory_budget",
        "host_memory_budget",
        "disk_cache_budget",
        mode="before",
    )
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)

    @field_validator("rate_limit_resources")
    @classmethod
    def _resources(cls, value: dict[str, int]) -> dict[str, int]:
        return check_resources(value)

    @field_validator("rate_limit", mode="before")
    @classmethod
    def _rate_limit(cls, value: Any) -> Any:
        # YAML reads an unquoted `off` as false: the user meant "off".
        return "off" if value is False else value


def load_settings(config_file: Path | None = None, **overrides: Any) -> AgentSettings:
    """Settings from flags (`overrides`; None means not given), env and the YAML file."""
    return AgentSettings.load(config_file, **overrides)


def reference_tables() -> str:
    """The Markdown tables of docs/configuration.md, generated from the models above
    (tests/agent/test_config.py fails when the document drifts from them)."""
    return render_tables(
        (
            (AgentSettings, ""),
            (RunnerSettings, "runner."),
            (FleetSettings, "fleet."),
            (SecuritySettings, "security."),
            (DoorSettings, "doors."),
            (SharedMemorySettings, "shared_memory."),
            (ModelConfig, ""),
            (Calibration, "calibration."),
            (VariantGuard, "variant_guard."),
        )
    )
