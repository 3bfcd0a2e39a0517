"""The native gRPC door: HTTP/2 by libnghttp2 (in C, `_nghttp2.pyx`), the gRPC
envelope here, and the same servicers as the grpcio door, on the agent's own
event loop.

grpcio's asyncio server runs its C core beside the event loop with a poller
thread of its own; under inference load on a small box that thread competes
with the runners for the CPUs, and a pure-Python HTTP/2 stack costs more than
it saves (docs/benchmarks.md). Here a connection is an asyncio protocol whose
frames nghttp2 parses and writes; a call is a task on the agent's loop, and
the responses that complete in one loop iteration leave in one write.

What it speaks, as grpcio's clients and tritonclient use it: unary and
bidirectional-streaming calls, `grpc-timeout`, metadata in (`-bin` keys
base64-decoded) and trailing metadata out, `grpc-status`/`grpc-message`
(percent-encoded) in trailers or a trailers-only response, identity encoding
(a compressed message is refused with UNIMPLEMENTED), flow control both ways,
RST_STREAM cancelling the call's task, GOAWAY on stop. Plaintext only: with
TLS configured the agent serves gRPC through grpcio. The method table comes
from the generated `add_*_to_server` functions, so both doors serve the same
methods with the same (de)serializers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from edgeplex.agent.frontdoor._nghttp2 import HTTP2Error, Session  # type: ignore[import-not-found]
from edgeplex.agent.frontdoor.grpc_wire import (
    NOT_METADATA,
    PREFIX,
    RESPONSE_HEADERS,
    Abort,
    Context,
    MethodTable,
    metadata_value,
    parse_timeout,
    status_trailers,
)

log = logging.getLogger("edgeplex.agent.grpc")

WINDOW = 4 * 1024 * 1024  # per stream and connection: few WINDOW_UPDATEs for large tensors
MAX_FRAME = 1024 * 1024
MAX_STREAMS = 1024
CANCEL = 0x8  # HTTP/2 error code of RST_STREAM


class _Stream:
    __slots__ = ("body", "context", "handler", "inbox", "started", "task")

    def __init__(self, handler: grpc.RpcMethodHandler, context: Context) -> None:
        self.handler = handler
        self.context = context
        self.body = bytearray()
        self.inbox: asyncio.Queue[bytes | None] | None = None  # streaming requests
        self.task: asyncio.Task[None] | None = None
        self.started = False  # response headers submitted


class GrpcProtocol(asyncio.Protocol):
    """One HTTP/2 connection: nghttp2 parses and frames, calls run as tasks."""

    def __init__(self, door: NativeGrpcDoor) -> None:
        self._door = door
        self._streams: dict[int, _Stream] = {}
        self._transport: Any = None
        self._peer = ""
        self._session = Session(self, MAX_STREAMS, WINDOW, MAX_FRAME)
        self._flush_due = False

    # --- asyncio ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        host, port = (transport.get_extra_info("peername") or ("", 0))[:2]
        self._peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self._door.connections.add(self)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._door.connections.discard(self)
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._streams.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self._session.receive(data)
        except HTTP2Error as exc:  # the peer broke the protocol: nghttp2 said GOAWAY
            log.debug("HTTP/2 error from %s: %s", self._peer, exc)
            self._flush()
            self.close()
            return
        except Exception:  # a bug of ours: this connection ends, the door serves on
            log.exception("gRPC connection from %s failed", self._peer)
            self.close()
            return
        self._flush()

    # --- nghttp2's events ---------------------------------------------------------------------

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        path, content_type, deadline, metadata = "", "", None, []
        for key, value in headers:
            if key == ":path":
                path = value
            elif key == "content-type":
                content_type = value
            elif key == "grpc-timeout":
                timeout = parse_timeout(value)
                deadline = None if timeout is None else time.monotonic() + timeout
            elif key == "grpc-encoding" and value != "identity":
                self._refuse(stream_id, grpc.StatusCode.UNIMPLEMENTED,
                             f"grpc-encoding {value} is not supported")  # fmt: skip
                return
            elif not key.startswith(":") and key not in NOT_METADATA:
                metadata.append((key, metadata_value(key, value)))
        if not content_type.startswith("application/grpc"):
            self._session.respond(stream_id, [(b":status", b"415")])
            return
        handler = self._door.methods.get(path)
        if handler is None:
            self._refuse(stream_id, grpc.StatusCode.UNIMPLEMENTED, f"no method {path}")
            return
        stream = _Stream(handler, Context(tuple(metadata), deadline, self._peer))
        self._streams[stream_id] = stream
        if handler.request_streaming:
            stream.inbox = asyncio.Queue()
            stream.task = self._door.spawn(self._call_streaming(stream_id, stream))

    def on_data(self, stream_id: int, data: bytes) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.body += data
        if len(stream.body) > self._door.max_message + PREFIX.size:
            self._drop(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"message larger than {self._door.max_message} bytes")  # fmt: skip
            return
        if stream.inbox is not None:  # each complete message goes to the call now
            for message in self._messages(stream_id, stream) or ():
                stream.inbox.put_nowait(message)

    def on_end(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.inbox is not None:
            stream.inbox.put_nowait(None)
            return
        messages = self._messages(stream_id, stream)
        if messages is None:
            return
        if len(messages) != 1 or stream.body:
            self._drop(stream_id, grpc.StatusCode.INTERNAL,
                       "a unary call carries exactly one message")  # fmt: skip
            return
        stream.task = self._door.spawn(self._call_unary(stream_id, stream, messages[0]))

    def on_close(self, stream_id: int, error_code: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None and stream.task is not None and not stream.task.done():
            stream.task.cancel()  # the client reset it, or the connection went

    # --- requests -----------------------------------------------------------------------------

    def _messages(self, stream_id: int, stream: _Stream) -> list[bytes] | None:
        """Complete length-prefixed messages taken off the stream's buffer."""
        out, body, at = [], stream.body, 0
        while len(body) - at >= PREFIX.size:
            compressed, length = PREFIX.unpack_from(body, at)
            if compressed:
                self._drop(stream_id, grpc.StatusCode.UNIMPLEMENTED,
                           "compressed messages are not supported")  # fmt: skip
                return None
            if len(body) - at - PREFIX.size < length:
                break
            out.append(bytes(body[at + PREFIX.size : at + PREFIX.size + length]))
            at += PREFIX.size + length
        del body[:at]
        return out

    async def _call_unary(self, stream_id: int, stream: _Stream, message: bytes) -> None:
        handler = stream.handler
        try:
            request = handler.request_deserializer(message)
        except Exception as exc:  # protobuf's DecodeError and friends
            self._finish(stream_id, stream, grpc.StatusCode.INTERNAL, f"undecodable: {exc}")
            return
        await self._answer(stream_id, stream, request, None)

    async def _call_streaming(self, stream_id: int, stream: _Stream) -> None:
        inbox = stream.inbox
        assert inbox is not None
        deserialize = stream.handler.request_deserializer

        async def requests() -> AsyncIterator[Any]:
            while (message := await inbox.get()) is not None:
                yield deserialize(message)

        await self._answer(stream_id, stream, None, requests())

    async def _answer(self, stream_id: int, stream: _Stream, request: Any,
                      requests: AsyncIterator[Any] | None) -> None:  # fmt: skip
        handler, context = stream.handler, stream.context
        serialize = handler.response_serializer
        try:
            if not handler.response_streaming:
                call = handler.unary_unary if requests is None else handler.stream_unary
                response = serialize(await call(requests if requests is not None else request,
                                                context))  # fmt: skip
                self._reply(stream_id, stream, response)
                return
            call = handler.unary_stream if requests is None else handler.stream_stream
            async for item in call(requests if requests is not None else request, context):
                self._send(stream_id, stream, serialize(item))
        except Abort as exc:
            self._finish(stream_id, stream, exc.code, exc.details)
            return
        except Exception as exc:
            log.exception("gRPC call on stream %d failed", stream_id)
            self._finish(stream_id, stream, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
            return
        self._finish(stream_id, stream, grpc.StatusCode.OK, "")

    # --- responses ----------------------------------------------------------------------------

    def _reply(self, stream_id: int, stream: _Stream, payload: bytes) -> None:
        """A unary call's answer: headers, the message and the trailers at once."""
        if self._streams.pop(stream_id, None) is None:
            return  # reset meanwhile
        trailers = status_trailers(grpc.StatusCode.OK, "") + stream.context.trailer_headers()
        body = PREFIX.pack(0, len(payload)) + payload
        with contextlib.suppress(HTTP2Error):
            self._session.respond(stream_id, RESPONSE_HEADERS, body, trailers)
        self._flush_soon()

    def _send(self, stream_id: int, stream: _Stream, payload: bytes) -> None:
        """One message of a streaming answer."""
        if stream_id not in self._streams:
            raise asyncio.CancelledError  # reset by the client: stop the call
        body = PREFIX.pack(0, len(payload)) + payload
        with contextlib.suppress(HTTP2Error):
            if stream.started:
                self._session.send(stream_id, body)
            else:
                stream.started = True
                self._session.respond(stream_id, RESPONSE_HEADERS, body, None, False)
        self._flush_soon()

    def _finish(self, stream_id: int, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        if self._streams.pop(stream_id, None) is None:
            return
        trailers = status_trailers(code, details) + stream.context.trailer_headers()
        with contextlib.suppress(HTTP2Error):
            if stream.started:
                self._session.send(stream_id, b"", True, trailers)
            else:  # trailers-only
                self._session.respond(stream_id, RESPONSE_HEADERS + trailers)
        self._flush_soon()

    def _refuse(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        with contextlib.suppress(HTTP2Error):
            self._session.respond(stream_id, RESPONSE_HEADERS + status_trailers(code, details))

    def _drop(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        """End a call the request itself broke, whatever it was doing."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None and stream.task is not None:
            stream.task.cancel()
        if stream is not None and stream.started:
            self._session.reset(stream_id, CANCEL)
        else:
            self._refuse(stream_id, code, details)

    def _flush_soon(self) -> None:
        """Responses finished in this loop iteration leave in one write."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        try:
            data = self._session.pending()
        except HTTP2Error as exc:
            log.debug("HTTP/2 error towards %s: %s", self._peer, exc)
            self.close()
            return
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def goaway(self) -> None:
        self._session.goaway()
        self._flush()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class NativeGrpcDoor:
    """The server: a listening socket, its connections and their calls."""

    def __init__(self, register: Callable[[MethodTable], None], max_message: int) -> None:
        table = MethodTable()
        register(table)
        self.methods = table.methods
        self.max_message = max_message
        self.connections: set[GrpcProtocol] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    def spawn(self, call: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: GrpcProtocol(self), host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new connections, tell the open ones to go away, let calls in flight
        finish within `grace`, then close."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.goaway()
        if self._tasks and grace:
            await asyncio.wait(list(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        for connection in list(self.connections):
            connection.close()
