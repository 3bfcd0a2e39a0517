"""The request path, counted: a ready model's request over HTTP crosses at most 12
hops between the agent's parts, from the door's read callback to the runner and
back, and no part calls back into the core.

The parts are the agent's folders (frontdoor, residency, batching, runners,
fleet, oip, catalog) and the core (core.py); a hop is a call from one part into
another on the request's way. Returns and a coroutine's resumption are not hops,
nor are calls into metrics, logs and stats, error types, or the data a request
carries (a model's record, tensors, the runner wire format). A callback the event
loop runs (a task's first step, a future's done callback, the runner's reply
arriving) counts as a hop when its part is not the one of the request's frames
that ran last (a background loop resuming between them, or the door's deadline
sweep, does not count). The agent
runs in this process with its real runner; the path is recorded with
sys.setprofile for one request after warm-up, and printed, with every call
between modules, when a check fails.
"""

from __future__ import annotations

import asyncio
import dis
import inspect
import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import numpy as np

import edgeplex.agent
from edgeplex.agent.catalog import demo
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.server import serve
from edgeplex.net import free_ports
from tests.support.load import binary_body

AGENT = Path(edgeplex.agent.__file__).resolve().parent
# Not places a request goes: metrics, logs and stats; error types; and the data it
# carries: a model's record (residency/state), tensors (oip/tensors) and the runner
# wire format (runners/framing, runners/ipc).
NOT_HOPS = (
    "observability/",
    "oip/errors",
    "residency/state",
    "oip/tensors",
    "runners/framing",
    "runners/ipc",
)
# The agent's own timers, not on any request's way: the HTTP door's deadline sweep.
BACKGROUND = {"start_sweeping"}
MAX_HOPS = 12
TOKEN = "path-test-token"


def module_of(frame: FrameType) -> str | None:
    """The agent module a frame runs in ("frontdoor/http_native"), or None."""
    path = Path(frame.f_code.co_filename)
    if not path.is_relative_to(AGENT):
        return None
    return str(path.relative_to(AGENT).with_suffix(""))


class PathRecorder:
    """Each call into another agent module, in order, while installed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (from module, to module, function)
        self._seen: set[int] = set()
        self._frames: list[FrameType] = []  # kept alive: their ids stay theirs
        self._last: str | None = None
        self._path: set[int] = set()  # frames first called while recording
        self._background: FrameType | None = None  # a timer of the agent's own, running
        self.recording = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            if event == "return" and frame is self._background:
                self._background = None
            return
        module = module_of(frame)
        if module is None or self._background is not None:
            return
        caller = frame.f_back
        if frame.f_code.co_name in BACKGROUND and (caller is None or not module_of(caller)):
            self._background = frame  # run by the event loop between the request's steps
            return
        if id(frame) in self._seen or _resumed(frame):  # a value coming back
            # Only the request's own frames: a background loop resuming meanwhile
            # (the overload watch's tick) is not where the next callback came from.
            if id(frame) in self._path:
                self._last = module
            return
        self._seen.add(id(frame))
        self._frames.append(frame)
        if frame.f_code.co_name == "data_received" and module == "frontdoor/http_native":
            self.recording = True  # the door's read callback: the path starts
        if self.recording:
            self._path.add(id(frame))
        if not self.recording or module.startswith(NOT_HOPS):
            return
        origin = module_of(caller) if caller is not None else None
        origin = origin or self._last  # called from the event loop
        if origin is not None and origin != module and not origin.startswith(NOT_HOPS):
            callback = "" if caller is not None and module_of(caller) else " (callback)"
            self.calls.append((origin, module, frame.f_code.co_name + callback))
        self._last = module


def _resumed(frame: FrameType) -> bool:
    """A coroutine or generator frame past its start: resumed, not called."""
    code = frame.f_code
    if not code.co_flags & (inspect.CO_COROUTINE | inspect.CO_GENERATOR):
        return False
    start = _starts.get(code)
    if start is None:
        start = _starts[code] = next(
            i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"
        )
    return frame.f_lasti > start


_starts: dict[CodeType, int] = {}


async def _request(port: int, head: bytes, body: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    status_line = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    payload = await reader.readexactly(length)
    writer.close()
    return int(status_line.split()[1]), payload


def _post(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _trace_one_request(settings: AgentSettings) -> tuple[int, list[tuple[str, str, str]]]:
    stop = asyncio.Event()
    agent = asyncio.create_task(serve(settings, stop))
    port = settings.http_port
    try:
        for _ in range(600):
            try:
                ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                if (await _request(port, ready, b""))[0] == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.05)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, text = await _request(port, _post("/v2/repository/models/mlp/load", b"", auth), b"")
        assert status == 200, text
        x = np.ones((1, 64), np.float32)
        body, headers = binary_body(x, binary_output=True)
        head = _post("/v2/models/mlp/infer", body, headers)
        for _ in range(20):  # warm: caches filled, the runner's session run once
            status, text = await _request(port, head, body)
            assert status == 200, text
        paths = []
        for _ in range(3):  # the fewest: a timer of the agent's own may fire during one
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            recorder = PathRecorder()
            sys.setprofile(recorder)
            try:
                writer.write(head + body)
                await reader.readuntil(b"\r\n\r\n")
            finally:
                sys.setprofile(None)
            writer.close()
            paths.append(recorder.calls)
        return status, min(paths, key=len)
    finally:
        stop.set()
        await agent


def part(module: str) -> str:
    """The part a module belongs to: its folder, or the core."""
    return module.split("/")[0]


def test_a_ready_models_request_crosses_at_most_twelve_hops_between_parts(
    tmp_path: Path,
) -> None:
    demo.make_mlp(tmp_path / "repo" / "mlp", width=64, layers=2)
    grpc_port, http_port = free_ports(2)
    settings = AgentSettings(
        model_repo=tmp_path / "repo",
        grpc_port=grpc_port,
        http_port=http_port,
        security={"admin_token": TOKEN},
    )
    _, calls = asyncio.run(_trace_one_request(settings))
    hops = [(a, b, fn) for a, b, fn in calls if part(a) != part(b)]
    shown = "\n".join(
        f"{'hop' if part(a) != part(b) else '   '} {a} -> {b} {fn}" for a, b, fn in calls
    )
    print(shown)
    assert calls, "nothing recorded: is the native HTTP door serving?"
    assert calls[-1][1].startswith("frontdoor/"), shown  # back at the door, answered
    assert any(b == "runners/connection" for _, b, _ in calls), shown  # to the runner
    assert [h for h in hops if h[1] == "core" and part(h[0]) != "frontdoor"] == [], shown
    assert len(hops) <= MAX_HOPS, f"{len(hops)} hops:\n{shown}"
