"""Load as users send it, for tests and benches alike: the binary request body
tritonclient sends, Zipf request shares, and a closed-loop client (a fixed number
of callers that never pause: each sends its next request when the last is
answered)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from itertools import repeat

import aiohttp
import numpy as np


def binary_body(
    x: np.ndarray,
    timeout_us: int | None = None,
    binary_output: bool = False,
    name: str = "input",
) -> tuple[bytes, dict[str, str]]:
    """One request with its tensor in the binary extension, as tritonclient sends it:
    the body and its headers. `binary_output` asks for the output in binary too."""
    doc: dict[str, object] = {
        "inputs": [
            {
                "name": name,
                "shape": list(x.shape),
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            }
        ]
    }
    if binary_output:
        doc["outputs"] = [{"name": "output", "parameters": {"binary_data": True}}]
    if timeout_us is not None:
        doc["parameters"] = {"timeout": timeout_us}
    header = json.dumps(doc).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + x.tobytes(), headers


def zipf_weights(n: int, alpha: float = 1.0) -> np.ndarray:
    """Request shares of `n` models by Zipf 1/rank**alpha, most requested first."""
    w = 1.0 / np.arange(1, n + 1) ** alpha
    return w / w.sum()  # type: ignore[no-any-return]


@dataclass
class LoopResult:
    latencies: list[float] = field(default_factory=list)  # seconds, one per request
    codes: dict[int, int] = field(default_factory=dict)  # HTTP status -> count
    errors: list[str] = field(default_factory=list)  # the first few non-200 answers
    elapsed: float = 0.0


async def closed_loop(
    url: str,
    models: list[str],
    clients: int,
    duration: float,
    seed: int,
    body: tuple[bytes, dict[str, str]] | None = None,
    keep_errors: int = 5,
    bodies: list[tuple[bytes, dict[str, str]]] | None = None,
    body_weights: np.ndarray | None = None,
) -> LoopResult:
    """`clients` callers that never pause for `duration` s against `url` (http://host:
    port), each picking a model by Zipf 1/rank over `models` (most requested first)
    and sending `body` (default: one 64-wide row, binary, output in binary); or, given
    `bodies`, one of them picked by `body_weights` (default: Zipf 1/rank)."""
    weights = zipf_weights(len(models))
    default = body or binary_body(np.full((1, 64), 0.5, np.float32), binary_output=True)
    choices = bodies or [default]
    shares = zipf_weights(len(choices)) if body_weights is None else body_weights
    result = LoopResult()
    started = time.perf_counter()
    stop = started + duration

    async def caller(i: int, session: aiohttp.ClientSession) -> None:
        rng = np.random.default_rng(seed * 100 + i)
        picks = iter(rng.choice(len(models), 1_000_000, p=weights))
        sends = iter(rng.choice(len(choices), 1_000_000, p=shares)) if bodies else repeat(0)
        while time.perf_counter() < stop:
            model = models[next(picks)]
            data, headers = choices[next(sends)]
            sent = time.perf_counter()
            async with session.post(
                f"{url}/v2/models/{model}/infer", data=data, headers=headers
            ) as reply:
                text = await reply.read()
            result.latencies.append(time.perf_counter() - sent)
            result.codes[reply.status] = result.codes.get(reply.status, 0) + 1
            if reply.status != 200 and len(result.errors) < keep_errors:
                result.errors.append(f"{model}: {reply.status} {text[:200]!r}")

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(caller(i, session) for i in range(clients)))
    result.elapsed = time.perf_counter() - started
    return result


def lean_flood(
    host: str, port: int, path: str, body: tuple[bytes, dict[str, str]], clients: int,
    duration: float,
) -> dict[int, int]:  # fmt: skip
    """`clients` keep-alive connections that each send the same request again as soon
    as the last is answered, for `duration` s: a flood as cheap for this machine's
    CPU as Python makes it (prebuilt request bytes, one selector, no HTTP library),
    so a test measures the server, not its own client. The status counts."""
    import selectors
    import socket

    data, headers = body
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    codes: dict[int, int] = {}
    selector = selectors.DefaultSelector()
    for _ in range(clients):
        sock = socket.create_connection((host, port))
        sock.setblocking(False)
        sock.sendall(request)  # small: fits the socket's buffer
        selector.register(sock, selectors.EVENT_READ, bytearray())
    stop = time.monotonic() + duration
    while time.monotonic() < stop:
        for key, _ in selector.select(0.1):
            sock, pending = key.fileobj, key.data
            chunk = sock.recv(1 << 16)  # type: ignore[union-attr]
            if not chunk:
                raise ConnectionError("the server closed a flood connection")
            pending += chunk
            end = pending.find(b"\r\n\r\n")
            if end < 0:
                continue
            length = 0
            for line in bytes(pending[:end]).split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(pending) < end + 4 + length:
                continue
            status = int(pending[9:12])
            codes[status] = codes.get(status, 0) + 1
            del pending[: end + 4 + length]
            sock.sendall(request)  # type: ignore[union-attr]
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return codes
