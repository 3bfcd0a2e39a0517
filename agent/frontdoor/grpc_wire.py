"""gRPC's wire conventions over HTTP/2, for the native door (grpc_native.py):
the message envelope, `grpc-timeout`, status trailers, metadata, and the part
of grpc.aio's ServicerContext the servicers use.
"""

from __future__ import annotations

import base64
import contextlib
import struct
import time
import urllib.parse

import grpc

from edgeplex.agent.frontdoor.gate import Pass
from edgeplex.agent.frontdoor.inflate import Corrupt, TooLarge, inflate

PREFIX = struct.Struct(">BI")  # compressed flag, message length
TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# Request headers that are HTTP/2 or gRPC plumbing, not the caller's metadata.
NOT_METADATA = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding",
                          "grpc-accept-encoding", "content-length"})  # fmt: skip
RESPONSE_HEADERS = [
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", b"identity,deflate,gzip"),
]
# grpc-message is percent-encoded: everything but printable ASCII and '%'.
MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def status_trailers(code: grpc.StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    trailers = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        trailers.append((b"grpc-message", urllib.parse.quote(details, safe=MESSAGE_SAFE).encode()))
    return trailers


def parse_timeout(value: str) -> float | None:
    """grpc-timeout: up to 8 digits and a unit."""
    try:
        return int(value[:-1]) * TIMEOUT_UNITS[value[-1]]
    except (KeyError, ValueError, IndexError):
        return None


class Abort(Exception):
    """Raised by Context.abort: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class MethodTable:
    """What the generated `add_*Servicer_to_server` functions register, by path."""

    def __init__(self) -> None:
        self.methods: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the registered handlers below carry the same methods

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self.methods[f"/{service}/{name}"] = handler


class Context:
    """The part of grpc.aio.ServicerContext the servicers use."""

    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...], deadline: float | None,
                 peer: str, received: float) -> None:  # fmt: skip
        self._metadata = metadata
        self._deadline = deadline
        self._peer = peer
        self.trailers: tuple[tuple[str, str | bytes], ...] = ()
        self.admitted: Pass | None = None  # the gate's pass, taken by the door
        self.received = received  # loop.time() its headers arrived: its deadline's start

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.trailers = tuple(metadata)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Abort(code, details)

    def trailer_headers(self) -> list[tuple[bytes, bytes]]:
        out = []
        for key, value in self.trailers:
            if isinstance(value, bytes):  # a -bin key
                value = base64.b64encode(value).decode().rstrip("=")
            out.append((key.encode(), value.encode()))
        return out


def metadata_value(key: str, value: str) -> str | bytes:
    if key.endswith("-bin"):
        with contextlib.suppress(ValueError):
            return base64.b64decode(value + "=" * (-len(value) % 4))
    return value


def decompress(data: bytes | memoryview, encoding: str, cap: int) -> bytes:
    """A message compressed with `encoding`, decompressed to at most `cap` bytes:
    RESOURCE_EXHAUSTED past it, INTERNAL when it does not decompress (as gRPC's
    compression spec says)."""
    try:
        return inflate(data, encoding, cap)
    except TooLarge:
        raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the decompressed message exceeds {cap} bytes") from None  # fmt: skip
    except Corrupt as exc:
        raise Abort(grpc.StatusCode.INTERNAL, f"the message is {exc}") from None
