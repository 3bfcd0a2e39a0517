"""Network facts shared by the agent and the control plane: addresses, tokens, test
ports, and the bound on a peer that falls silent."""

from __future__ import annotations

import ipaddress
import random
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


def grpc_silence_options(
    seconds: float, ping_after_s: float = 2 * 3600
) -> tuple[tuple[str, int], ...]:
    """Channel or server options that close a connection once bytes sent on it stay
    unacknowledged for `seconds`: a link cut under it (no reset, no FIN) fails the
    calls on it then, not when the kernel gives up retransmitting (about 15
    minutes). gRPC sets TCP_USER_TIMEOUT from its keepalive timeout once keepalive
    is on (gRPC proposal A18). A connection with calls on it is pinged after
    `ping_after_s` without a frame from its peer (none while idle): a client keeps
    the default of two hours, since servers count frequent pings as strikes; a
    server that must find peers that vanished while it had nothing to send (a
    stream it only reads) pings sooner."""
    return (
        ("grpc.keepalive_time_ms", int(ping_after_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(seconds * 1000)),
    )


def tcp_silence_options(seconds: float) -> tuple[tuple[int, int, int], ...]:
    """setsockopt arguments that make a TCP socket give up once bytes sent on it
    stay unacknowledged for `seconds` (TCP_USER_TIMEOUT, where the platform has
    it; none elsewhere): the same bound as `grpc_silence_options`, for clients that
    open their own sockets."""
    if not hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux only
        return ()
    return ((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000)),)


def silent_peer_socket(seconds: float, family: int, kind: int, proto: int) -> socket.socket:
    """A TCP socket with `tcp_silence_options(seconds)` set."""
    sock = socket.socket(family, kind, proto)
    for option in tcp_silence_options(seconds):
        sock.setsockopt(*option)
    return sock


def bearer_token(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value (scheme in any case)."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


# Below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default), where
# the kernel never puts the local end of an outgoing connection: a port chosen here
# stays free between its choice and the bind of the process it was chosen for, even
# while tests run side by side and open connections of their own.
PICK_FROM = range(20000, 32768)


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (for agents that tests and benchmarks
    start), drawn at random below the ephemeral range: the sockets are held together,
    so two asked for in a row are never the same port, which would put two listeners
    of one agent on one port."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", random.choice(PICK_FROM)))
            except OSError:  # in use: draw again
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
