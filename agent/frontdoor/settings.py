"""The settings of the agent's network doors: their limits (deadlines, caps and
flood defences, `doors.*`) and who may use them (`security.*`).

Every default is one a public edge can run with; nginx's and Envoy's served as
the reference (docs/security.md, "Denial of service", says when to change
each). The native doors apply all of them; the aiohttp and grpcio fallbacks
apply what their libraries offer (named per field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from edgeplex.sizes import KiB, MiB, parse_size


class SharedMemorySettings(BaseModel):
    """Triton's system shared-memory extension (frontdoor/shared_memory.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="Let clients on this machine register POSIX shared-memory regions and "
        "name them in requests instead of sending tensors.",
    )
    key_prefix: str = Field(
        default="/",
        description="Only keys that start with this may be registered (the agent's own, "
        "`/edgeplex-*`, never).",
    )
    max_regions: int = Field(default=64, ge=0, description="Regions registered at once.")
    max_bytes: int = Field(
        default=16 * 1024 * MiB,
        description="Bytes of all registered regions together (size suffixes allowed).",
    )

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)


class DoorSettings(BaseModel):
    """Limits of the OIP doors (HTTP/1.1 and HTTP/2), per connection and in total."""

    model_config = ConfigDict(extra="forbid")

    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request's line and headers must have arrived this long after its "
        "first byte (nginx client_header_timeout; Envoy request_headers_timeout); beyond "
        "it the connection closes. HTTP/2: a stream's headers likewise.",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Grace for a request body on top of body_min_rate: a body of N bytes "
        "must be complete within body_timeout_s + N / body_min_rate of its headers, or "
        "the request is answered 408 and the connection closes (HTTP/2: the stream is "
        "reset). Trickling cannot extend it.",
    )
    body_min_rate: int = Field(
        default=64 * KiB,
        gt=0,
        description="Slowest upload accepted, in bytes per second (size suffixes allowed); "
        "see body_timeout_s.",
    )
    keepalive_timeout_s: float = Field(
        default=75.0,
        gt=0,
        description="An idle connection (no request in progress) closes after this long "
        "(nginx keepalive_timeout 75 s). The clock starts when the last answer is written "
        "and bytes of a new request do not restart it: they start header_timeout_s.",
    )
    max_header_bytes: int = Field(
        default=32 * KiB,
        ge=1024,
        description="Request line and headers together, per request (nginx: 4 x 8 KiB); "
        "beyond, 431 and the connection closes. HTTP/2: the header list size, announced "
        "in SETTINGS_MAX_HEADER_LIST_SIZE; beyond, the stream is refused.",
    )
    max_headers: int = Field(
        default=100,
        ge=8,
        description="Header fields per request (Envoy max_headers_count 100); beyond, 431.",
    )
    max_pipelined: int = Field(
        default=8,
        ge=1,
        description="HTTP/1.1 requests read ahead on one connection while earlier ones are "
        "answered; beyond, the door stops reading the connection until they are.",
    )
    max_connections: int = Field(
        default=4096,
        ge=1,
        description="Open connections per door. At the cap a new connection takes the place "
        "of the longest-idle one, and is refused when none is idle.",
    )
    max_connections_per_client: int = Field(
        default=256,
        ge=1,
        description="Open connections per door from one client address (nginx limit_conn); "
        "at the cap as for max_connections. Clients behind one NAT share it.",
    )
    abuse_penalty_s: float = Field(
        default=10.0,
        ge=0,
        description="An address whose connection was closed for abuse (a flood of resets, "
        "PINGs, SETTINGS or PRIORITY frames) has its new connections refused this long, "
        "so reconnecting costs an attacker time instead of the agent CPU. 0: off.",
    )
    max_concurrent_streams: int = Field(
        default=100,
        ge=1,
        description="HTTP/2 streams (gRPC calls) open at once per connection "
        "(SETTINGS_MAX_CONCURRENT_STREAMS; nginx 128, grpc-go 100); also the inference "
        "requests one streaming call may have outstanding at once.",
    )
    stream_window: int = Field(
        default=1 * MiB,
        ge=64 * KiB,
        description="HTTP/2 flow-control window per stream (size suffixes allowed). Windows "
        "are refilled as calls take their messages, so a slow consumer holds at most this "
        "much per stream and connection_window per connection.",
    )
    connection_window: int = Field(
        default=4 * MiB,
        ge=64 * KiB,
        description="HTTP/2 flow-control window per connection (size suffixes allowed).",
    )
    max_connection_bytes: int = Field(
        default=160 * MiB,
        ge=1 * MiB,
        description="Request bytes one HTTP/2 connection may hold across its calls (declared "
        "message sizes; size suffixes allowed); a call beyond it is refused with "
        "RESOURCE_EXHAUSTED before its message is read.",
    )
    max_stream_messages: int = Field(
        default=16,
        ge=1,
        description="Messages of a streaming call queued for it before the door stops "
        "refilling its window (the client then waits).",
    )
    max_resets_per_s: float = Field(
        default=10.0,
        gt=0,
        description="Rapid-reset defence: streams a client may cancel per second per "
        "connection, with a burst of 10 times it (CVE-2023-44487). Beyond, GOAWAY "
        "(ENHANCE_YOUR_CALM) and the TCP connection closes.",
    )
    max_control_frames_per_s: float = Field(
        default=100.0,
        gt=0,
        description="PING, SETTINGS and PRIORITY frames a client may send per second per "
        "connection, with a burst of 10 times it; beyond, GOAWAY and close.",
    )
    min_ping_interval_s: float = Field(
        default=10.0,
        ge=0,
        description="Keepalive policy (grpc's min_recv_ping_interval): PINGs closer together "
        "than this while the agent sent nothing count as strikes; after 2, GOAWAY "
        "`too_many_pings` and close.",
    )
    max_connection_idle_s: float = Field(
        default=300.0,
        gt=0,
        description="An HTTP/2 connection with no call open for this long gets GOAWAY and "
        "closes (grpc MAX_CONNECTION_IDLE).",
    )
    shed_loop_lag_s: float = Field(
        default=0.25,
        gt=0,
        description="Overload shedding: while the agent's event loop runs this late, new "
        "inference requests are refused at once (429 / RESOURCE_EXHAUSTED, reason "
        "`loop_lag`) and health, status and /metrics still answer.",
    )
    shed_memory_available: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Overload shedding: while the memory available to the agent (its cgroup "
        "limit, else the host's MemAvailable) is below this fraction of the total, new "
        "inference requests are refused (reason `memory`). 0: off.",
    )

    @field_validator(
        "body_min_rate",
        "max_header_bytes",
        "stream_window",
        "connection_window",
        "max_connection_bytes",
        mode="before",
    )
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)


class SecuritySettings(BaseModel):
    """Who may command this agent, and how its ports are exposed (docs/security.md)."""

    model_config = ConfigDict(extra="forbid")

    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the mutating verbs (repository load and unload, pin, "
        "unpin, demote; HTTP and gRPC). Unset: read from admin_token_file, generated there "
        "at first start.",
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="Where the generated admin token lives (mode 0600). Unset: "
        "`admin-token` in the state directory ($STATE_DIRECTORY under systemd, else "
        "$XDG_STATE_HOME/edgeplex or ~/.local/state/edgeplex).",
    )
    inference_api_key: SecretStr | None = Field(
        default=None,
        description="If set, inference and model routes need `Authorization: Bearer <key>` "
        "too (health, metadata and /metrics stay open). It is the key of a tenant named "
        "`default` (docs/tenants.md).",
    )
    tenants_file: Path | None = Field(
        default=None,
        description="A standalone agent's tenants, keys and limits (YAML; `edgeplex admin "
        "tenant ... --file` writes it), reread when it changes. An agent in a fleet takes "
        "them from the control plane instead.",
    )
    anonymous: Literal["auto", "allow", "deny"] = Field(
        default="auto",
        description="Inference without a key: `auto` serves it only while no tenant (and "
        "no inference_api_key) exists; `allow` and `deny` decide for good.",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate of both OIP ports; set: they serve TLS."
    )
    tls_key: Path | None = Field(default=None, description="PEM key of tls_cert.")
    insecure: bool = Field(
        default=False,
        description="Allow binding a non-loopback address without TLS (a private network "
        "or a test rig). Without it such a bind is refused at start.",
    )
