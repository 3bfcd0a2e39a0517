"""Coverage-guided fuzzing of the doors' decoders with atheris (libFuzzer for
Python; Python-level coverage).

Targets:
- `oip_body`: an HTTP inference body (Content-Encoding and the binary split
  header drawn from the input) through decode_content and parse_infer_body;
- `grpc_request`: bytes as a ModelInferRequest, then decode_inputs;
- `http1`: raw bytes into the native HTTP door's connection (llhttp and the
  door's head decisions), answered by a handler that echoes a status;
- `h2_session`: raw bytes (after the client preface) into the HTTP/2 session.

A crash (an exception other than the refusals each decoder documents), a hang
(libFuzzer's -timeout) or a 5xx from the HTTP door is a failure. Seed corpora
live in tests/fuzz_corpus/<target>/. The suite runs each target briefly
(tests/agent/frontdoor/test_fuzz_doors.py); run longer here:

    python bench/fuzz_doors.py oip_body -max_total_time=600 tests/fuzz_corpus/oip_body
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import aiohttp.web  # noqa: F401  (libraries imported first are not instrumented:
import atheris
import grpc  # noqa: F401         only edgeplex's own code is, which keeps start-up short)
import numpy  # noqa: F401
import orjson  # noqa: F401
import prometheus_client  # noqa: F401
import pydantic  # noqa: F401
from google.protobuf import message  # noqa: F401

with atheris.instrument_imports(include=["edgeplex"]):
    from google.protobuf.message import DecodeError

    from edgeplex.agent.frontdoor import http_native
    from edgeplex.agent.frontdoor.auth import Access
    from edgeplex.agent.frontdoor.gate import InflightGate
    from edgeplex.agent.frontdoor.grpc_body import decode_inputs
    from edgeplex.agent.frontdoor.http import Route
    from edgeplex.agent.frontdoor.oip_body import decode_content, parse_infer_body
    from edgeplex.agent.frontdoor.settings import DoorSettings
    from edgeplex.agent.oip.errors import InvalidInput
    from edgeplex.proto import inference_pb2 as pb

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


TARGETS = {f.__name__: f for f in (oip_body, grpc_request, http1, h2_session)}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: fuzz_doors.py {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
