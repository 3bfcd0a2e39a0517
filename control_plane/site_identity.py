"""Who is calling AgentService: a site proves its identity before it may register
or report.

- A join token from `edgeplex admin site add SITE --region R`, shown once and
  stored as its sha256, sent as `authorization: Bearer <token>` metadata. It is
  bound to one site and one region: a site can never register as, or
  overwrite, another.
- Or an mTLS client certificate whose common name or a subject alternative
  name is the site id.

Advertised addresses must name a host peers can reach: no wildcard address.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

import grpc

from edgeplex.control_plane.store import Store
from edgeplex.net import bearer_token

WILDCARDS = {"", "0.0.0.0", "::", "*"}


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def new_token() -> str:
    return "ejt_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def certificate_names(context: grpc.aio.ServicerContext) -> set[str]:
    auth = context.auth_context() or {}
    names = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            names.add(value.decode() if isinstance(value, bytes) else str(value))
    return names


def bearer(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return bearer_token(value)
    return None


async def authenticate(
    context: grpc.aio.ServicerContext, store: Store, site_id: str, region: str | None
) -> None:
    """Raise Refused unless the caller proves it is `site_id` (of `region`, when the
    call names one)."""
    if site_id in certificate_names(context):
        return
    token = bearer(context)
    if token is None:
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            f"site '{site_id}' needs its join token (edgeplex admin site add) or a client "
            "certificate that names it",
        )
    digest = token_hash(token)
    entry = await store.join_token(site_id)
    if entry is None or not hmac.compare_digest(digest, entry[0]):
        owner = await store.join_token_owner(digest)
        if owner is not None:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this join token belongs to another site, not '{site_id}'",
            )
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED, f"the join token of '{site_id}' is not valid"
        )
    if region is not None and region != entry[1]:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"site '{site_id}' was added in region '{entry[1]}', not '{region}'",
        )


def check_address(what: str, address: str, required: bool, allow_loopback: bool = True) -> None:
    """`host:port` with a concrete host and a port in 1..65535 that the control plane
    and peers may be sent to: never a wildcard, multicast, broadcast or link-local
    address (cloud metadata services live there), and a loopback one only when the
    control plane itself is on loopback (`allow_loopback`: a one-box fleet)."""
    if not address:
        if required:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: host:port is required")
        return
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: '{address}' is not host:port")
    if host in WILDCARDS or _unspecified(host):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: '{address}' is a wildcard address; advertise one peers can reach",
        )
    kind = _unroutable(host)
    if kind:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: '{address}' is {kind}")
    if not allow_loopback and (host == "localhost" or _is(host, "is_loopback")):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: '{address}' is a loopback address, and the control plane is not on "
            "loopback; advertise one peers can reach",
        )


def _unspecified(host: str) -> bool:
    return _is(host, "is_unspecified")


def _unroutable(host: str) -> str:
    for attribute, kind in (
        ("is_multicast", "a multicast address"),
        ("is_link_local", "a link-local address"),
    ):
        if _is(host, attribute):
            return kind
    return "a broadcast address" if host == "255.255.255.255" else ""


def _is(host: str, attribute: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    return bool(getattr(address, attribute))
