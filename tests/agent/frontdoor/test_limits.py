"""Each door limit at its edge (one under and one over), the connection limiter,
the gate's accounting, and the linear cost of the JSON nesting check. Raw
sockets against a real agent where a door is involved."""

from __future__ import annotations

import contextlib
import socket
import statistics
import time

import pytest

from edgeplex.agent.frontdoor.connections import ConnectionLimiter
from edgeplex.agent.frontdoor.gate import InflightGate
from edgeplex.agent.frontdoor.oip_body import MAX_JSON_DEPTH, json_depth, load_json
from edgeplex.agent.frontdoor.settings import DoorSettings
from edgeplex.agent.oip.errors import InvalidInput, Overloaded
from tests.conftest import start_agent
from tests.support.http1 import closed, read_response

HEADER_CAP = 4096
MAX_HEADERS = 10


@pytest.fixture(scope="module")
def agent(model_repo, tmp_path_factory):
    process = start_agent(
        model_repo,
        tmp_path_factory.mktemp("limits"),
        env={
            "EDGEPLEX_AGENT_HTTP_SERVER": "native",
            "EDGEPLEX_AGENT_DOORS__MAX_HEADER_BYTES": str(HEADER_CAP),
            "EDGEPLEX_AGENT_DOORS__MAX_HEADERS": str(MAX_HEADERS),
            "EDGEPLEX_AGENT_DOORS__HEADER_TIMEOUT_S": "1",
            "EDGEPLEX_AGENT_DOORS__BODY_TIMEOUT_S": "1",
            "EDGEPLEX_AGENT_DOORS__BODY_MIN_RATE": "1000",
            "EDGEPLEX_AGENT_DOORS__KEEPALIVE_TIMEOUT_S": "1.5",
            "EDGEPLEX_AGENT_DOORS__MAX_CONNECTIONS_PER_CLIENT": "8",
        },
    )
    yield process
    assert process.stop() == 0, process.log()


def exchange(agent, data: bytes, source: str = "127.0.0.1") -> tuple[int, socket.socket]:
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", agent.http_port))
    sock.sendall(data)
    status, _, _ = read_response(sock, bytearray())
    return status, sock


def get_with_header(size: int) -> bytes:
    """A GET whose request line and headers add up to exactly `size` bytes as counted
    (the URL, names and values)."""
    fixed = len("/v2") + len("Host") + len("x") + len("X-Pad")
    return f"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * (size - fixed)}\r\n\r\n".encode()


def test_header_bytes_at_the_cap_pass_and_one_over_is_431(agent):
    status, sock = exchange(agent, get_with_header(HEADER_CAP))
    assert status == 200
    sock.close()
    status, sock = exchange(agent, get_with_header(HEADER_CAP + 1))
    assert status == 431 and closed(sock)


def test_header_count_at_the_cap_passes_and_one_more_is_431(agent):
    def request(n: int) -> bytes:
        extra = "".join(f"X-H{i}: v\r\n" for i in range(n - 1))
        return f"GET /v2 HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()

    status, sock = exchange(agent, request(MAX_HEADERS))
    assert status == 200
    sock.close()
    status, sock = exchange(agent, request(MAX_HEADERS + 1))
    assert status == 431 and closed(sock)


def test_an_admin_body_over_its_cap_is_refused_from_the_head(agent):
    cap = 64 * 1024
    for size, expected in ((cap, 401), (cap + 1, 413)):  # no token: 401 within the cap
        head = f"POST /edgeplex/v1/memory HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
        status, sock = exchange(agent, head.encode())  # the body is never sent
        assert status == expected
        sock.close()


def test_a_refusal_before_the_body_still_reaches_a_client_that_sends_it(agent):
    """Lingering close: the client writes its whole (refused) body, then reads."""
    body = b"x" * (4 << 20)
    head = f"POST /v2/nothing/here HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
    sock.sendall(head.encode() + body)
    status, _, _ = read_response(sock, bytearray())
    assert status == 404


def trickle(sock: socket.socket, pieces: list[bytes], seconds: float) -> int | None:
    """Send `pieces` one every 0.1 s until the agent answers (its status) or closes
    (None), for at most `seconds`."""
    deadline = time.monotonic() + seconds
    for piece in pieces:
        if time.monotonic() > deadline:
            break
        try:
            sock.send(piece)
        except OSError:
            return None
        time.sleep(0.1)
        sock.setblocking(False)
        try:
            data = sock.recv(4096)
            return int(data[9:12]) if data else None
        except BlockingIOError:
            pass
        finally:
            sock.setblocking(True)
    return None


def test_the_header_deadline_is_not_extended_by_trickling(agent):
    sock = socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
    start = time.monotonic()
    request = b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    status = trickle(sock, [bytes([byte]) for byte in request], 10)
    assert status == 408
    assert time.monotonic() - start < 2.5  # 1 s deadline, however the bytes trickle


def test_a_body_slower_than_the_minimum_rate_is_cut_off(agent):
    # 3000 bytes at 1000 B/s with 1 s of grace: 4 s allowed; sent at 500 B/s it misses.
    head = "POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3000\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", agent.http_port), timeout=10)
    sock.sendall(head.encode())
    start = time.monotonic()
    status = trickle(sock, [b"x" * 50] * 80, 8)
    assert status == 408
    assert 3.5 < time.monotonic() - start < 6


def test_an_idle_connection_closes_at_the_keepalive_timeout(agent):
    status, sock = exchange(agent, b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200
    start = time.monotonic()
    sock.settimeout(5)
    assert sock.recv(1) == b""
    assert 1.0 < time.monotonic() - start < 3.0


def test_connections_per_address_take_the_place_of_the_longest_idle(agent):
    source = "127.0.0.7"
    socks = []
    for _ in range(8):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", agent.http_port))
        socks.append(s)
    time.sleep(0.2)
    extra = socket.socket()
    extra.bind((source, 0))
    extra.connect(("127.0.0.1", agent.http_port))
    extra.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, _ = read_response(extra, bytearray())
    assert status == 200  # served: the longest-idle connection made room
    socks[0].settimeout(5)
    assert socks[0].recv(1) == b""
    # Another address is not affected.
    status, sock = exchange(agent, b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n", "127.0.0.8")
    assert status == 200
    for s in [*socks, extra, sock]:
        s.close()


# --- pure objects -----------------------------------------------------------------------------


class _Conn:
    def __init__(self) -> None:
        self.closed = False

    def close_idle(self) -> None:
        self.closed = True


def test_the_limiter_refuses_when_nothing_is_idle_and_penalises():
    limiter = ConnectionLimiter("http", max_total=2, max_per_client=2, penalty_s=60)
    a, b, c = _Conn(), _Conn(), _Conn()
    assert limiter.admit(a, "x") and limiter.admit(b, "y")
    limiter.busy(a)
    limiter.busy(b)
    assert not limiter.admit(c, "z")  # at the cap, none idle
    limiter.idle(b, "y")
    assert limiter.admit(c, "z") and b.closed  # b made room
    limiter.penalise("z", "rapid_reset")
    assert not limiter.admit(_Conn(), "z")


def test_the_gate_counts_growth_and_releases_once():
    gate = InflightGate(max_requests=2, max_bytes=100)
    first = gate.admit(60)
    with pytest.raises(Overloaded, match="bytes"):
        gate.admit(41)
    second = gate.admit(40)
    with pytest.raises(Overloaded):
        second.grow(41)  # decompressed past the budget
    with pytest.raises(Overloaded, match="requests"):
        gate.admit(0)
    first.release()
    first.release()  # idempotent
    assert (gate.requests, gate.bytes) == (1, 40)
    held = gate.hold(50, admitted=second)  # a door's pass is not counted twice
    assert held is second
    assert (gate.requests, gate.bytes) == (1, 50)


def test_the_gate_sheds_with_its_reason():
    reason: list[str | None] = [None]
    gate = InflightGate(10, 1000, lambda: reason[0])
    gate.admit(1).release()
    reason[0] = "loop_lag"
    with pytest.raises(Overloaded, match="loop lag"):
        gate.admit(1)


def test_default_limits_are_those_of_a_public_edge():
    d = DoorSettings()
    assert d.max_concurrent_streams <= 128 and d.max_header_bytes <= 64 * 1024
    assert d.header_timeout_s <= 60 and d.keepalive_timeout_s <= 75


# --- the JSON nesting check costs time linear in the bytes ------------------------------------

SHAPES = {
    "unterminated escapes": lambda n: b"[" * 40 + b'"' + b'\\"' * (n // 2),
    "deep nesting": lambda n: b"[" * n,
    "brackets in strings": lambda n: b'["[' * (n // 3),
    "long escapes": lambda n: b'[["' + b"\\\\" * (n // 2),
    "many keys": lambda n: b"{" + b'"a":[],' * (n // 7) + b'"b":1}',
}


def _per_kb(text: bytes) -> float:
    """Time per KB of decoding `text` as a request's JSON (the nesting check, then
    the parser, or the refusal)."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        with contextlib.suppress(InvalidInput):
            load_json(text, 8 << 20)
        runs.append(time.perf_counter() - start)
    return min(runs) / (len(text) / 1024)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_decoding_json_is_linear_in_the_bytes(shape):
    make = SHAPES[shape]
    small = statistics.median(_per_kb(make(1024)) for _ in range(3))
    large = _per_kb(make(1 << 20))
    assert large <= 2 * small, (shape, small, large)


def test_a_megabyte_of_adversarial_json_is_refused_or_decoded_within_20_ms():
    for shape, make in SHAPES.items():
        text = make(1 << 20)
        took = _per_kb(text) * len(text) / 1024  # the best of five: the cost, not the noise
        assert took < 0.02 * 3, (shape, took)  # 3x slack for a loaded CI box


def test_nesting_is_counted_outside_strings_only():
    assert json_depth(b"[" * 33 + b"]" * 33) == 33
    assert json_depth(b'["' + b"[" * 40 + b'"]') <= 1
    assert json_depth(b'["\\"' + b"[" * 40 + b'"]') <= 1  # an escaped quote stays inside
    assert json_depth(b'["\\\\", ' + b"[" * 40 + b"]" * 40 + b"]") == 41  # \\ ends nothing
    assert MAX_JSON_DEPTH == 32


async def test_a_blocked_loop_and_short_memory_shed_new_work():
    """The watch sees a loop blocked past its limit, and memory below its floor; the
    gate then refuses with that reason, and admits again once they pass."""
    import asyncio

    from edgeplex.agent.frontdoor.overload import OverloadWatch, memory_available_fraction

    watch = OverloadWatch(max_lag_s=0.1, min_memory_available=0)
    gate = InflightGate(10, 1000, watch.reason)
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(0.12)
    time.sleep(0.3)  # the loop is blocked, as a flood of work would block it
    await asyncio.sleep(0.01)
    with pytest.raises(Overloaded, match="loop lag"):
        gate.admit(1)
    await asyncio.sleep(0.2)
    gate.admit(1).release()
    left = memory_available_fraction()
    assert left is not None and 0 < left <= 1
    watch.min_memory_available = 1.0  # nothing left counts as enough
    await asyncio.sleep(0.6)
    with pytest.raises(Overloaded, match="memory"):
        gate.admit(1)
    task.cancel()
