"""Address facts shared by the agent and the control plane."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; a name or a wildcard ("",
    "0.0.0.0", "::") may reach the network, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
