"""Address facts shared by the agent and the control plane."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; a name or a wildcard ("",
    "0.0.0.0", "::") may reach the network, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bearer_token(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value (scheme in any case)."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (for agents that tests and benchmarks
    start): the sockets are held together, so two asked for in a row are never the
    same port, which would put two listeners of one agent on one port."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
