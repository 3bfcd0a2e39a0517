"""How an agent belongs to a fleet (`fleet.*` settings; part of AgentSettings in
agent/config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from edgeplex.names import NAME_RULE, valid_name
from edgeplex.settings import ArtifactDeadline, ArtifactFileRoots, ArtifactSchemes
from edgeplex.sizes import parse_size


class FleetSettings(BaseModel):
    """Membership in a fleet run by `edgeplex control-plane`. Off unless
    `control_plane` is set; then `site_id`, `region` and `mqtt_url` are required."""

    model_config = ConfigDict(extra="forbid")

    control_plane: str | None = Field(
        default=None,
        description="host:port of the control plane's gRPC API, or a comma-separated list of "
        "its replicas (tried in turn); unset: standalone.",
    )
    site_id: str = Field(default="", description="This site's name, unique in the fleet.")
    region: str = Field(default="", description="The region this site serves.")
    mqtt_url: str | None = Field(
        default=None,
        description="MQTT broker carrying desired state: mqtt://[user:password@]host:port "
        "(mqtts:// for TLS).",
    )
    advertise_address: str | None = Field(
        default=None,
        description="host:port peers and clients reach this agent's OIP gRPC port at. Unset: "
        "grpc_host:grpc_port.",
    )
    advertise_http_address: str | None = Field(
        default=None, description="Same for the OIP HTTP port. Unset: http_host:http_port."
    )
    artifact_dir: Path | None = Field(
        default=None,
        description="Content-addressed cache of downloaded artifacts. Unset: `.artifacts` "
        "inside the model repository.",
    )
    max_artifact_bytes: int = Field(
        default=8 * 1024**3, gt=0, description="Largest artifact this agent downloads, in bytes."
    )
    artifact_schemes: ArtifactSchemes = ["https"]
    artifact_file_roots: ArtifactFileRoots = []
    artifact_deadline_s: ArtifactDeadline = 600.0
    control_plane_key: str | None = Field(
        default=None,
        description="The control plane's Ed25519 public key (base64 of the raw 32 bytes; the "
        "control plane logs it at start). Unset: the key presented at the first "
        "registration is pinned in trust_file (trust on first use).",
    )
    trust_file: Path | None = Field(
        default=None,
        description="Where the pinned control-plane key is kept. Unset: `control-plane.pub` "
        "in the state directory.",
    )
    join_token: SecretStr | None = Field(
        default=None,
        description="This site's join token from `edgeplex admin site add` (shown once). "
        "Register and Report need it unless an mTLS certificate names the site.",
    )
    tls_ca: Path | None = Field(
        default=None,
        description="PEM CA of the control plane's certificate (and of the broker's, with "
        "mqtts://); set: TLS is on.",
    )
    allow_plaintext: bool = Field(
        default=False,
        description="Register with a control plane without TLS (no tls_ca), and use "
        "`mqtt://`, although it is not on loopback. Off: the agent refuses to start "
        "that way, since whoever sits on the path at its first start reads the join token "
        "and has their key pinned. For closed test networks only.",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM client certificate for mTLS to the control plane."
    )
    tls_key: Path | None = Field(default=None, description="PEM key of tls_cert.")
    peer_tls_ca: Path | None = Field(
        default=None,
        description="PEM CA of the fleet's OIP certificates (security.tls_cert). Set: requests "
        "are forwarded to peers over TLS (https, secure gRPC) verified against it.",
    )

    @property
    def control_plane_targets(self) -> list[str]:
        """The control plane's replicas (host:port), in the order they are tried."""
        return [t.strip() for t in (self.control_plane or "").split(",") if t.strip()]

    @field_validator("site_id", "region")
    @classmethod
    def _name(cls, value: str) -> str:
        """Checked once here, so nothing on the request path checks them again."""
        if value and not valid_name(value):
            raise ValueError(f"{value[:64]!r} is not a name: {NAME_RULE}")
        return value

    @field_validator("max_artifact_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)
