"""Typed configuration of `edgeplex control-plane`.

The only module of the control plane that reads the environment. Precedence,
highest first: command-line flags, `EDGEPLEX_CP_*` environment variables, the
YAML file given with --config, the defaults below. The admin token is also
read from `EDGEPLEX_ADMIN_TOKEN`, the variable the admin CLI uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from edgeplex.control_plane.placement import CHURN_COST, FORWARD_VALUE
from edgeplex.logs import LogFormat
from edgeplex.settings import (
    ArtifactDeadline,
    ArtifactFileRoots,
    ArtifactSchemes,
    FileSettings,
    render_tables,
)


class ControlPlaneSettings(FileSettings):
    """Settings of `edgeplex control-plane`."""

    model_config = SettingsConfigDict(env_prefix="EDGEPLEX_CP_", extra="forbid")

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis holding all control-plane state: redis://[user:password@]host:port/db "
        "(rediss:// for TLS), or redis+sentinel://host:port[,host:port...]/service[/db] for "
        "a primary that Sentinels watch and fail over (docs/deployment.md).",
    )
    redis_wait_replicas: int | None = Field(
        default=None,
        ge=0,
        description="Replicas that must have a write that has to survive a failover (catalog, "
        "sites, tenants, usage, batch jobs) before it is acknowledged (Redis WAIT); until "
        "then the caller is answered UNAVAILABLE. Unset: 1 with Sentinels, else 0.",
    )
    redis_wait_ms: int = Field(
        default=2000, ge=1, description="How long a write waits for those replicas."
    )
    mqtt_url: str = Field(
        default="mqtt://127.0.0.1:1883",
        description="MQTT broker for desired state and routes: mqtt://[user:password@]host:port "
        "(mqtts:// for TLS).",
    )
    grpc_host: str = Field(default="127.0.0.1", description="Address of the gRPC server.")
    grpc_port: int = Field(default=7070, ge=0, le=65535, description="gRPC port; 0 = any.")
    http_host: str = Field(default="127.0.0.1", description="Address of /metrics and /healthz.")
    http_port: int | None = Field(
        default=None, ge=0, le=65535, description="HTTP port of /metrics and /healthz; unset: off."
    )
    admin_token: str | None = Field(
        default=None,
        description="Bearer token the admin API requires (also EDGEPLEX_ADMIN_TOKEN). Without "
        "one the control plane does not start.",
    )
    batch_token: str | None = Field(
        default=None,
        description="Bearer token of the batch-submitter role: submit, follow, fetch and "
        "cancel batch jobs, and read the catalog; nothing else. Unset: no such role.",
    )
    read_token: str | None = Field(
        default=None,
        description="Bearer token of the read-only role (dashboards, monitoring): list and "
        "get models, sites, placement and batches; it changes nothing. Unset: no such role.",
    )
    replica_id: str = Field(
        default="",
        validate_default=True,
        description="Name of this replica in the leader lease. Empty: <hostname>-<pid>.",
    )
    leader_lease_s: float = Field(
        default=5.0, gt=0, description="Leader lease; a standby takes over within this long."
    )
    site_lease_s: float = Field(
        default=10.0,
        gt=0,
        description="A site that has not reported for this long is marked down and its models "
        "are placed elsewhere.",
    )
    report_interval_s: float = Field(
        default=2.0, gt=0, description="How often agents are told to report load."
    )
    placement_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="Placement runs this often on the leader, and at once "
        "on events (a site down or up, a catalog change).",
    )
    demand_half_life_s: float = Field(
        default=60.0, gt=0, description="Half-life of the EWMA that turns reports into demand."
    )
    forecast_horizon_s: float = Field(
        default=3600.0,
        ge=0,
        description="Place for the demand forecast this far ahead (seasonal by hour of day "
        "and week, scaled to how today runs; a burst's recent level where demand runs well "
        "above the season), so models move before a region's peak. 0: place from observed "
        "demand only. Forecasting pays where a site's first copy of a model is slow to "
        "arrive: on the standard simulated fleet it saved 2-4 GPUs in 37 with downloads at "
        "100 Mbit/s, none at 300 Mbit/s, and cost about one in 33 at 1 Gbit/s "
        '(docs/benchmarks.md, "Sized seed by seed").',
    )
    churn_cost: float = Field(
        default=CHURN_COST,
        ge=0,
        description="Hysteresis of placement: requests/s of demand that loading one more GiB "
        "somewhere must gain over what it displaces; room nothing else wants is filled "
        "without it.",
    )
    forward_value: float = Field(
        default=FORWARD_VALUE,
        ge=0,
        le=1,
        description="What placement counts a request served from another region within its "
        "SLO as worth, against one served in its own region (then scaled by 1 - one-way "
        "latency / SLO). Low values keep what a region's own clients ask for in the region; "
        "1 spreads the catalog across regions for the sake of forwarding.",
    )
    region_latency_ms: dict[str, float] = Field(
        default_factory=dict,
        description="One-way latency between regions, keyed 'a,b' (symmetric). A pair that is "
        "absent is treated as unreachable for SLO purposes.",
    )
    region_clock_offset_h: dict[str, float] = Field(
        default_factory=dict,
        description="Hours each region's local time is ahead of UTC, for batch jobs: shards "
        "prefer sites where it is night (22:00-06:00 local). Absent regions: UTC.",
    )
    artifact_dir: Path | None = Field(
        default=None,
        description="Content-addressed cache where the control plane verifies artifacts. "
        "Unset: a private temporary directory.",
    )
    max_artifact_bytes: int = Field(
        default=8 * 1024**3, gt=0, description="Largest artifact accepted, in bytes."
    )
    artifact_schemes: ArtifactSchemes = ["https"]
    artifact_file_roots: ArtifactFileRoots = []
    artifact_deadline_s: ArtifactDeadline = 600.0
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate of the gRPC server; with tls_key, TLS is on."
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of the gRPC server.")
    insecure: bool = Field(
        default=False,
        description="Serve gRPC beyond loopback without TLS, and the HTTP port (dashboard, "
        "/metrics) beyond loopback at all (it has no TLS): on a network you trust. Off: "
        "the control plane refuses to start that way.",
    )
    tls_client_ca: Path | None = Field(
        default=None,
        description="PEM CA bundle; when set, clients must present a certificate it signed "
        "(mTLS for the agent link).",
    )
    mqtt_tls_ca: Path | None = Field(
        default=None,
        description="PEM CA of the broker's certificate, for an mqtts:// mqtt_url. Unset: "
        "the system's CAs.",
    )
    mqtt_password_file: Path | None = Field(
        default=None,
        description="The broker's password file, when this control plane manages it: "
        "`admin site add` then gives each site its own broker user (its site id) with a "
        "new password. Set with mqtt_acl_file.",
    )
    mqtt_acl_file: Path | None = Field(
        default=None, description="The broker's ACL file, rewritten by `admin site add`."
    )
    mqtt_pid_file: Path | None = Field(
        default=None, description="The broker's pid file: it is sent SIGHUP to reload both."
    )
    mqtt_cp_user: str = Field(
        default="edgeplex-cp", description="The control plane's own user in that ACL."
    )
    mqtt_bridge_users: list[str] = Field(
        default=[],
        description="Broker users of bridges from other brokers (docs/deployment.md, bridged "
        "brokers): the managed ACL lets each read every fleet topic. Each is named edgeplex-... "
        "so no site can take it.",
    )
    open_registration: bool = Field(
        default=False,
        description="Accept Register and Report without a join token or a certificate that "
        "names the site. Only for a closed test network: anyone who reaches the port could "
        "then register as any site.",
    )
    signing_key_file: Path | None = Field(
        default=None,
        description="Ed25519 key that signs desired state and routes, created with mode 0600 "
        "when missing. Every replica needs the same one. Unset: `signing-key` in the state "
        "directory ($STATE_DIRECTORY under systemd, else ~/.local/state/edgeplex).",
    )
    message_compression: bool = Field(
        default=True,
        description="Deflate the desired states and routes sent to agents (about 2.7x smaller "
        "at a thousand models a site). Agents before this setting existed cannot read them: "
        "upgrade the agents first, or turn this off until they are.",
    )
    message_ttl_s: float = Field(
        default=6 * 3600.0,
        gt=60,
        description="Signed messages expire after this long; the leader re-signs the latest "
        "ones every third of it, so a site that restarts always finds a valid one retained.",
    )
    usage_minutes_kept_h: float = Field(
        default=48.0,
        gt=0,
        description="How long the sites' usage minutes are kept beside their hourly sums "
        "(docs/tenants.md). Older hours keep their sums only: a usage query must then start "
        "and end on the hour, and a minute a site sends that late is added to its hour once.",
    )
    usage_kept_days: float = Field(
        default=90.0,
        gt=0,
        description="How long hourly usage sums are kept; older ones are dropped. Bill from "
        "`edgeplex admin usage --by hour --csv` to keep them longer elsewhere.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level."
    )
    log_format: LogFormat = Field(
        default="text",
        description="`text` lines, or `json`: one object per line (time, level, logger, "
        "message) for a log pipeline.",
    )

    @field_validator("replica_id", mode="before")
    @classmethod
    def _replica_id(cls, value: Any) -> Any:
        return value or f"{os.uname().nodename}-{os.getpid()}"

    @field_validator("mqtt_bridge_users")
    @classmethod
    def _bridges_reserved(cls, value: list[str]) -> list[str]:
        for user in value:
            if not user.lower().startswith("edgeplex-") or not user.isprintable() or " " in user:
                raise ValueError(f"mqtt_bridge_users: {user!r} must be named edgeplex-...")
        return value

    @field_validator("admin_token", mode="before")
    @classmethod
    def _token_from_env(cls, value: Any) -> Any:
        return value or os.environ.get("EDGEPLEX_ADMIN_TOKEN") or None

    def latency_pairs(self) -> dict[tuple[str, str], float]:
        pairs = {}
        for key, ms in self.region_latency_ms.items():
            a, _, b = key.partition(",")
            if not b:
                raise ValueError(f"region_latency_ms key {key!r}: use 'region_a,region_b'")
            pairs[(a.strip(), b.strip())] = float(ms)
        return pairs


def load_settings(config_file: Path | None = None, **overrides: Any) -> ControlPlaneSettings:
    """Settings from flags (`overrides`; None means not given), env and the YAML file."""
    return ControlPlaneSettings.load(config_file, **overrides)


def reference_tables() -> str:
    """docs/configuration.md's control-plane table (kept current by a test)."""
    return render_tables(((ControlPlaneSettings, ""),))
