"""Who may call what on the agent's own ports.

- The mutating verbs (repository load and unload, pin, unpin, demote) need the
  agent's admin token, on loopback too. Configured (`security.admin_token`), or
  generated at first start into a mode-0600 file in the agent's state
  directory, where `edgeplex` tools and operators read it. One exception, opted
  into: with `model_control_mode: explicit`, repository load and unload are open
  to loopback clients (as Triton's are to every client), and need the admin token
  from anywhere else. System shared memory (registering regions, and naming one
  in a request) is for clients on this machine: loopback, or the admin token.
- Inference and model routes need a tenant's key (or the admin token) once any
  tenant exists, `security.inference_api_key` being tenant `default`'s key
  (frontdoor/tenants.py, docs/tenants.md); health, server metadata and /metrics
  stay open.

Both travel as `Authorization: Bearer <token>` (gRPC: `authorization`
metadata) and are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import ssl
from enum import Enum
from pathlib import Path

import grpc

from edgeplex.agent.frontdoor.settings import SecuritySettings
from edgeplex.agent.frontdoor.tenants import Tenants
from edgeplex.agent.oip.errors import PermissionDenied, Unauthenticated
from edgeplex.durable import create_atomic, sweep_temporary
from edgeplex.net import bearer_token, is_loopback
from edgeplex.settings import state_dir

log = logging.getLogger("edgeplex.agent.auth")

TOKEN_FILE = "admin-token"


class Access(Enum):
    OPEN = "open"
    CLIENT = "client"  # inference and model routes: the inference key, when one is set
    ADMIN = "admin"
    CONTROL = "control"  # repository load and unload: admin, or loopback in explicit mode
    LOCAL = "local"  # shared memory: loopback, or the admin token


def peer_host(peer: str) -> str:
    """The host of a client's address: "127.0.0.1" of gRPC's "ipv4:127.0.0.1:5000",
    "::1" of "ipv6:[::1]:5000"; an HTTP door's address as it is."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return peer


def is_local(peer: str) -> bool:
    """A client on this machine: a loopback address, or a Unix socket."""
    return peer.startswith("unix:") or is_loopback(peer_host(peer))


def token_file(security: SecuritySettings) -> Path:
    return security.admin_token_file or state_dir() / TOKEN_FILE


def admin_token(security: SecuritySettings) -> str:
    """The configured token, or the one in the token file (created, mode 0600, with a
    new random token when it does not exist yet; written whole or not at all)."""
    if security.admin_token is not None and security.admin_token.get_secret_value():
        return security.admin_token.get_secret_value()  # an empty one means unset
    path = token_file(security)
    sweep_temporary(path.parent, path.name)  # what a writer killed mid-way left
    token = secrets.token_urlsafe(32)
    if create_atomic(path, (token + "\n").encode(), point="admin-token"):
        log.info("generated the admin token in %s (mode 0600)", path)
        return token
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others; chmod 600 it")
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{path} is empty: delete it to have a new token generated")
    log.info("admin token: %s", path)
    return token


class Credentials:
    def __init__(
        self, admin: str, tenants: Tenants | None = None, loopback_control: bool = False
    ) -> None:
        self._admin = admin.encode()
        self.tenants = tenants if tenants is not None else Tenants()
        self.tenants.admin = self._admin
        self._loopback_control = loopback_control  # model_control_mode: explicit

    @classmethod
    def from_settings(
        cls, security: SecuritySettings, tenants: Tenants, loopback_control: bool = False
    ) -> Credentials:
        return cls(admin_token(security), tenants, loopback_control)

    def check(self, access: Access, authorization: str | None, what: str, peer: str = "") -> str:
        """Raise Unauthenticated (no or wrong credential) or PermissionDenied (a
        tenant's key on an admin verb) unless `authorization` grants `access` to the
        client at `peer` (an address, or gRPC's "ipv4:host:port"). Returns who the
        caller is for inference (a tenant, "admin" or "anonymous"), else ""."""
        if access == Access.OPEN:
            return ""
        if access == Access.CLIENT:
            return self.tenants.identify(authorization)
        if access in (Access.CONTROL, Access.LOCAL):  # open to this machine, or admin
            opens = access == Access.LOCAL or self._loopback_control
            if opens and is_local(peer):
                return ""
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated(f"{what} needs 'Authorization: Bearer <token>'")
        if hmac.compare_digest(token.encode(), self._admin):
            return ""
        if self.tenants.table.identify(token) is not None:
            raise PermissionDenied(f"{what} needs the admin token, not an inference key")
        raise Unauthenticated(f"{what}: the token is not valid")


def check_binds(*hosts: str, security: SecuritySettings) -> None:
    """Refuse to expose a port beyond loopback in clear text unless told `insecure`."""
    exposed = [h or "*" for h in hosts if not is_loopback(h)]
    if exposed and security.tls_cert is None and not security.insecure:
        raise ValueError(
            f"refusing to serve {', '.join(sorted(set(exposed)))} without TLS: set "
            "security.tls_cert and security.tls_key, or pass --insecure on a network "
            "you trust"
        )


def tls_credentials(
    security: SecuritySettings,
) -> tuple[ssl.SSLContext, ssl.SSLContext, grpc.ServerCredentials] | None:
    """Server TLS for both OIP ports, from security.tls_cert and tls_key: the HTTP
    door's context, the native gRPC door's (ALPN h2) and grpcio's credentials."""
    if security.tls_cert is None:
        return None
    if security.tls_key is None:
        raise ValueError("security.tls_cert needs security.tls_key")
    contexts = []
    for alpn in (["http/1.1"], ["h2"]):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # HTTP/2 asks for 1.2 at least
        context.load_cert_chain(security.tls_cert, security.tls_key)
        context.set_alpn_protocols(alpn)
        contexts.append(context)
    chain = security.tls_cert.read_bytes()
    key = security.tls_key.read_bytes()
    return contexts[0], contexts[1], grpc.ssl_server_credentials([(key, chain)])
