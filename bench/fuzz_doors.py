"""Coverage-guided fuzzing of the doors' decoders with atheris (libFuzzer for
Python; Python-level coverage).

Targets:
- `oip_body`: an HTTP inference body (Content-Encoding and the binary split
  header drawn from the input) through decode_content and parse_infer_body;
- `grpc_request`: bytes as a ModelInferRequest, then decode_inputs;
- `http1`: raw bytes into the native HTTP door's connection (llhttp and the
  door's head decisions), answered by a handler that echoes a status;
- `h2_session`: raw bytes (after the client preface) into the HTTP/2 session;
- `grpc_door`: raw bytes (after the client preface) into a connection of the
  native gRPC door, serving an echoing ModelInfer and ModelStreamInfer: its
  frames, limits, compression, gate accounting and calls, which nghttp2 alone
  (in C, not instrumented) does not show the fuzzer.

A crash (an exception other than the refusals each decoder documents), a hang
(libFuzzer's -timeout), a 5xx from the HTTP door, an error the gRPC door logs
as its own bug, or a gate pass or connection byte count left behind is a
failure. Seed corpora live in tests/fuzz_corpus/<target>/ (grpc_door's are
written by `fuzz_doors.py seeds DIR`). The suite runs each target briefly
(tests/agent/frontdoor/test_fuzz_doors.py); run longer here:

    python bench/fuzz_doors.py oip_body -max_total_time=600 tests/fuzz_corpus/oip_body
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web  # noqa: F401  (libraries imported first are not instrumented:
import atheris
import grpc  #                   only edgeplex's own code is, which keeps start-up short)
import numpy  # noqa: F401
import orjson  # noqa: F401
import prometheus_client  # noqa: F401
import pydantic  # noqa: F401
from google.protobuf import message  # noqa: F401

with atheris.instrument_imports(include=["edgeplex"]):
    from google.protobuf.message import DecodeError

    from edgeplex.agent.frontdoor import grpc_native, http_native
    from edgeplex.agent.frontdoor.auth import Access
    from edgeplex.agent.frontdoor.gate import InflightGate
    from edgeplex.agent.frontdoor.grpc_body import decode_inputs
    from edgeplex.agent.frontdoor.http import Route
    from edgeplex.agent.frontdoor.oip_body import decode_content, parse_infer_body
    from edgeplex.agent.frontdoor.settings import DoorSettings
    from edgeplex.agent.oip.errors import InvalidInput
    from edgeplex.proto import inference_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks import (  # HTTP/2 frames by hand
    DATA,
    END_HEADERS,
    END_STREAM,
    GRPC_HEADERS,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    frame,
    hpack,
)

CAP = 1 << 20


def oip_body(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    encoding = fdp.PickValueInList(["", "identity", "gzip", "deflate", "br"])
    split = fdp.PickValueInList([None, str(fdp.ConsumeIntInRange(0, 4096)), "x"])
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    with contextlib.suppress(InvalidInput):
        parse_infer_body(decode_content(body, encoding, CAP), split, CAP, CAP)


def grpc_request(data: bytes) -> None:
    try:
        request = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return
    with contextlib.suppress(InvalidInput):
        decode_inputs(request, CAP)


class _Transport:
    """What the HTTP connection writes, kept; closing ends the input."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.out += bytes(part)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


class _Credentials:
    def check(self, access: Access, authorization: str | None, what: str) -> None:
        pass


async def _ok(request: Any) -> Any:
    body = await request.read()
    return http_native.json_error(200 if len(body) < 100 else 400, "ok")


_LOOP = asyncio.new_event_loop()
_ROUTES = [
    Route("POST", "/v2/models/{model}/infer", _ok, Access.CLIENT, "infer", 4096, True),
    Route("GET", "/v2", _ok, Access.OPEN, "metadata", 1024, False),
]


def http1(data: bytes) -> None:
    async def run() -> bytes:
        door = http_native.Door(http_native.Routes(_ROUTES), _Credentials(),  # type: ignore[arg-type]
                                InflightGate(8, 1 << 20), DoorSettings())  # fmt: skip
        conn = http_native.Connection(door)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        for i in range(0, len(data), 61):  # in pieces, as a network delivers them
            if transport.closed:
                break
            conn.data_received(data[i : i + 61])
            await asyncio.sleep(0)
        for _ in range(4):
            await asyncio.sleep(0)
        conn.connection_lost(None)
        assert door.gate.requests == 0 and door.gate.bytes == 0, "a gate pass leaked"
        return bytes(transport.out)

    out = _LOOP.run_until_complete(run())
    for line in out.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 5"):
            raise AssertionError(f"a 5xx answer: {line!r}")


class _Owner:
    def on_headers(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        pass

    def on_data(self, stream_id: int, data: bytes) -> None:
        pass

    def on_end(self, stream_id: int) -> None:
        pass

    def on_close(self, stream_id: int, error_code: int) -> None:
        pass

    def on_control(self, kind: str) -> None:
        pass


def h2_session(data: bytes) -> None:
    from edgeplex.agent.frontdoor._nghttp2 import HTTP2Error, Session

    session = Session(_Owner(), 100, 1 << 20, 1 << 20, 4 << 20, 32768)
    try:
        session.receive(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + data)
        session.pending()
    except HTTP2Error:
        pass


class _Bugs(logging.Handler):
    """The gRPC door's errors: what it logs as a failure of its own code."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_BUGS = _Bugs()
logging.getLogger("edgeplex.agent.grpc").addHandler(_BUGS)
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
GZIP = (("grpc-encoding", "gzip"),)


async def _echo(request: Any, context: Any) -> Any:
    if request.id == "abort":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "asked to abort")
    context.set_trailing_metadata((("x-echo-bin", request.id.encode()),))
    return pb.ModelInferResponse(model_name=request.model_name, id=request.id)


async def _echo_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        if request.id == "abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "asked to abort")
        yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))


def _register(table: Any) -> None:
    parse, write = pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
    table.add_registered_method_handlers("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(_echo, parse, write),
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            _echo_stream, parse, pb.ModelStreamInferResponse.SerializeToString),
    })  # fmt: skip


def grpc_door(data: bytes) -> None:
    async def run() -> None:
        limits = DoorSettings(max_stream_messages=4)
        door = grpc_native.NativeGrpcDoor(_register, 64 * 1024, InflightGate(8, 1 << 20), limits)
        door._loop = asyncio.get_running_loop()
        conn = grpc_native.GrpcProtocol(door)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        payload = PREFACE + data
        for i in range(0, len(payload), 97):  # in pieces, as a network delivers them
            if transport.closed:
                break
            conn.data_received(payload[i : i + 97])
            await asyncio.sleep(0)
        for _ in range(8):  # the calls run, their answers flush
            await asyncio.sleep(0)
        conn.connection_lost(None)
        await asyncio.gather(*door._tasks, return_exceptions=True)
        assert not _BUGS.records, _BUGS.format(_BUGS.records[0])
        assert door.gate.requests == 0 and door.gate.bytes == 0, "a gate pass leaked"
        assert conn._held == 0 and not conn._streams, "a call's bytes stayed counted"

    _LOOP.run_until_complete(run())


def _call(sid: int, path: str, messages: list[bytes], headers: tuple = (),
          compressed: bool = False, end: bool = True) -> bytes:  # fmt: skip
    fields = [(k, path if k == ":path" else v) for k, v in GRPC_HEADERS] + list(headers)
    out = frame(HEADERS, END_HEADERS, sid, hpack(fields))
    for i, sent in enumerate(messages):
        last = end and i == len(messages) - 1
        body = struct.pack(">BI", int(compressed), len(sent)) + sent
        out += frame(DATA, END_STREAM if last else 0, sid, body)
    return out


def seeds(directory: Path) -> None:
    """grpc_door's seed corpus: calls as grpc clients send them, each a file."""
    infer = pb.ModelInferRequest(model_name="m", id="a").SerializeToString()
    aborting = pb.ModelInferRequest(model_name="m", id="abort").SerializeToString()
    settings = frame(SETTINGS, 0, 0)
    cases = {
        "unary": _call(1, GRPC_HEADERS[3][1], [infer], (("grpc-timeout", "5S"),)),
        "unary_abort": _call(1, GRPC_HEADERS[3][1], [aborting], (("x-meta-bin", "AAE"),)),
        "unary_gzip": _call(
            1, GRPC_HEADERS[3][1], [gzip.compress(infer, mtime=0)], GZIP, compressed=True
        ),
        "unary_not_protobuf": _call(1, GRPC_HEADERS[3][1], [b"\xff\xff\xff"]),
        "stream": _call(1, STREAM, [infer, infer, aborting, infer]),
        "stream_open": _call(1, STREAM, [infer], end=False) + frame(PING, 0, 0, bytes(8)),
        "reset": _call(1, GRPC_HEADERS[3][1], [infer], end=False)
        + frame(RST_STREAM, 0, 1, struct.pack(">I", 8)),
        "two_calls": _call(1, GRPC_HEADERS[3][1], [infer]) + _call(3, STREAM, [infer]),
        "unknown_method": _call(1, "/x.Y/Z", [infer]),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in cases.items():
        (directory / name).write_bytes(settings + data)


TARGETS = {f.__name__: f for f in (oip_body, grpc_request, http1, h2_session, grpc_door)}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "seeds":
        seeds(Path(sys.argv[2]))
        return
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(
            f"usage: fuzz_doors.py {{{','.join(TARGETS)}}} [libFuzzer flags]\n"
            "       fuzz_doors.py seeds DIR   (grpc_door's seed corpus)"
        )
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
