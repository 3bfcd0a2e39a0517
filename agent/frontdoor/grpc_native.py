"""The native gRPC door: HTTP/2 by libnghttp2 (in C, `_nghttp2.pyx`), the gRPC
envelope here, and the same servicers as the grpcio door, on the agent's own
event loop.

grpcio's asyncio server runs its C core beside the event loop with a poller
thread of its own; under inference load on a small box that thread competes
with the runners for the CPUs, and a pure-Python HTTP/2 stack costs more than
it saves (docs/lab-notebook.md). Here a connection is an asyncio protocol whose
frames nghttp2 parses and writes; a call is a task on the agent's loop, and
the responses that complete in one loop iteration leave in one write.

What it speaks, as grpcio's clients and tritonclient use it: unary and
bidirectional-streaming calls, `grpc-timeout`, metadata in (`-bin` keys
base64-decoded) and trailing metadata out, `grpc-status`/`grpc-message`
(percent-encoded) in trailers or a trailers-only response, request messages
compressed with gzip or deflate (`grpc-encoding`; decompressed off the loop,
and only up to the method's cap: RESOURCE_EXHAUSTED past it), RST_STREAM cancelling
the call's task, GOAWAY on stop; plaintext, or TLS with ALPN h2. The method
table comes from the generated `add_*_to_server` functions, so both doors serve
the same methods with the same (de)serializers.

Its limits are set, not inherited (DoorSettings): concurrent streams and the
header list size are announced in SETTINGS and enforced; flow-control windows
are refilled only as calls take their data (a unary call's message once
admitted, a streaming call's while its inbox is short), so a slow consumer
holds a window's worth and no more. A unary call is admitted from its
message's 5-byte prefix, before the message is read: the method's cap, the
connection's `max_connection_bytes`, and for inference the agent's in-flight
gate (RESOURCE_EXHAUSTED beyond). Uploads have a deadline with a minimum
rate; resets (CVE-2023-44487) and PING, SETTINGS and PRIORITY frames are
rate-limited per connection, PINGs follow grpc's keepalive policy, and an
idle connection gets GOAWAY; a client over a limit gets GOAWAY
(ENHANCE_YOUR_CALM), its TCP connection closes at once, and its address waits
`abuse_penalty_s` before it may connect again. A message that does not parse
is INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from ssl import SSLContext
from typing import Any

import grpc

from edgeplex.agent.frontdoor._nghttp2 import HTTP2Error, Session  # type: ignore[import-not-found]
from edgeplex.agent.frontdoor.connections import ConnectionLimiter
from edgeplex.agent.frontdoor.gate import InflightGate, Pass
from edgeplex.agent.frontdoor.grpc_wire import (
    NOT_METADATA,
    PREFIX,
    RESPONSE_HEADERS,
    Abort,
    Context,
    MethodTable,
    decompress,
    metadata_value,
    parse_timeout,
    status_trailers,
)
from edgeplex.agent.frontdoor.inflate import ENCODINGS
from edgeplex.agent.frontdoor.settings import DoorSettings
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import ServeError

log = logging.getLogger("edgeplex.agent.grpc")

MAX_FRAME = 1024 * 1024
CANCEL, NO_ERROR, ENHANCE_YOUR_CALM = 0x8, 0x0, 0xB  # HTTP/2 error codes
TICK_S = 1.0  # how often a connection checks its deadlines
LINGER_S = 1.0  # reading and dropping after a GOAWAY for abuse, before the socket closes
MAX_PING_STRIKES = 2
# A write larger than the ACKs due plus this carries a call's headers or data (a
# WINDOW_UPDATE is 13 bytes; the ACKs are counted as the frames come).
CONTROL_FRAMES_BYTES = 64
ACK_BYTES = {"ping": 17, "settings": 9}  # a PING ACK, a SETTINGS ACK
SMALL_MESSAGE = 1024 * 1024  # the cap of every method's message but inference's
INFER = "/inference.GRPCInferenceService/ModelInfer"


class Bucket:
    """A token bucket: `take` is False once more than `burst` came faster than `rate`."""

    __slots__ = ("_at", "_burst", "_rate", "_tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self._rate, self._burst = rate, burst
        self._tokens, self._at = burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class _Stream:
    __slots__ = (
        "admitted",
        "body",
        "cap",
        "compressed",
        "context",
        "deadline",
        "declared",
        "encoding",
        "gated",
        "handler",
        "held",
        "inbox",
        "started",
        "task",
        "unconsumed",
    )  # fmt: skip

    def __init__(self, handler: grpc.RpcMethodHandler, context: Context, gated: bool, cap: int,
                 deadline: float) -> None:  # fmt: skip
        self.handler = handler
        self.context = context
        self.gated = gated  # inference: admitted through the agent's gate
        self.cap = cap  # the largest message this method takes
        self.deadline = deadline  # the request's message must be in by then (unary)
        self.body = bytearray()
        self.encoding = ""  # the request's grpc-encoding: "", "gzip" or "deflate"
        self.compressed = False  # the unary message's flag (streaming: per message)
        self.declared = -1  # the unary message's length, once its prefix is in
        self.held = 0  # bytes counted against the connection's max_connection_bytes
        self.admitted: Pass | None = None
        self.inbox: asyncio.Queue[tuple[bool, bytes] | None] | None = None  # streaming requests
        self.unconsumed = 0  # streaming: bytes received but not yet given back as window
        self.task: asyncio.Task[None] | None = None
        self.started = False  # response headers submitted


class GrpcProtocol(asyncio.Protocol):
    """One HTTP/2 connection: nghttp2 parses and frames, calls run as tasks. Every
    method runs on the event loop."""

    def __init__(self, door: NativeGrpcDoor) -> None:
        self._door = door
        self._loop = asyncio.get_running_loop()  # held: each lookup is a getpid() call
        limits = self._limits = door.limits
        self._streams: dict[int, _Stream] = {}
        self._transport: Any = None
        self._peer = ""
        self._client = ""
        self._session = Session(self, limits.max_concurrent_streams, limits.stream_window,
                                MAX_FRAME, limits.connection_window,
                                limits.max_header_bytes)  # fmt: skip
        self._flush_due = False
        self._held = 0  # request bytes held by this connection's calls
        self._resets = Bucket(limits.max_resets_per_s, 10 * limits.max_resets_per_s)
        self._control = Bucket(limits.max_control_frames_per_s,
                               10 * limits.max_control_frames_per_s)  # fmt: skip
        self._last_ping = 0.0
        self._strikes = 0
        self._answered_since_ping = False
        self._acks_due = 0  # bytes of PING and SETTINGS ACKs the next flush writes
        self._last_active = time.monotonic()
        self._tick: asyncio.TimerHandle | None = None
        self._closing = False

    # --- asyncio ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        host, port = (transport.get_extra_info("peername") or ("", 0))[:2]
        self._client = str(host)
        self._peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        if not self._door.limiter.admit(self, self._client):
            transport.abort()  # type: ignore[attr-defined]
            return
        self._door.connections.add(self)
        self._tick = self._loop.call_later(TICK_S, self._on_tick)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._door.limiter.leave(self, self._client)
        self._door.connections.discard(self)
        if self._tick is not None:
            self._tick.cancel()
        for stream_id in list(self._streams):
            stream = self._forget(stream_id)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            self._session.receive(data)
        except HTTP2Error as exc:  # the peer broke the protocol: nghttp2 said GOAWAY
            # Not penalised: a client speaking HTTP/1 to this port is a mistake, not a flood.
            log.debug("HTTP/2 error from %s: %s", self._peer, exc)
            METRICS.door_refusals.labels(door="grpc", reason="protocol_error").inc()
            self._flush()
            self.close(linger=True)
            return
        except Exception:  # a bug of ours: this connection ends, the door serves on
            log.exception("gRPC connection from %s failed", self._peer)
            self.close()
            return
        self._flush()
        if self._session.done():  # nghttp2 ended the session (its own flood limits)
            self._door.limiter.penalise(self._client, "session_ended")
            self.close(linger=True)

    def close_idle(self) -> None:
        """The door needs the room this connection holds (it has no call open)."""
        self.goaway()
        self.close()

    # --- nghttp2's events ---------------------------------------------------------------------

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        self._last_active = time.monotonic()
        self._door.limiter.busy(self)
        path, content_type, deadline, metadata, encoding = "", "", None, [], ""
        for key, value in headers:
            if key == ":path":
                path = value
            elif key == "content-type":
                content_type = value
            elif key == "grpc-timeout":
                timeout = parse_timeout(value)
                deadline = None if timeout is None else time.monotonic() + timeout
            elif key == "grpc-encoding" and value != "identity":
                if value not in ENCODINGS:
                    refusal = f"grpc-encoding {value} is not supported (gzip, deflate)"
                    self._refuse(stream_id, grpc.StatusCode.UNIMPLEMENTED, refusal)
                    return
                encoding = value
            elif not key.startswith(":") and key not in NOT_METADATA:
                metadata.append((key, metadata_value(key, value)))
        if not content_type.startswith("application/grpc"):
            self._session.respond(stream_id, [(b":status", b"415")])
            self._session.reset(stream_id, NO_ERROR)
            return
        handler = self._door.methods.get(path)
        if handler is None:
            self._refuse(stream_id, grpc.StatusCode.UNIMPLEMENTED, f"no method {path}")
            return
        gated = path == INFER
        cap = self._door.max_message if gated or handler.request_streaming else SMALL_MESSAGE
        upload = time.monotonic() + self._limits.body_timeout_s
        context = Context(tuple(metadata), deadline, self._peer, self._loop.time())
        stream = _Stream(handler, context, gated, cap, upload)
        stream.encoding = encoding
        self._streams[stream_id] = stream
        if handler.request_streaming:
            stream.inbox = asyncio.Queue()
            stream.task = self._door.spawn(self._call_streaming(stream_id, stream))

    def on_data(self, stream_id: int, data: bytes) -> None:
        self._answered_since_ping = True  # a call in progress: its PINGs are BDP probes
        stream = self._streams.get(stream_id)
        if stream is None:  # refused or dropped already: give the window back
            self._session.consume(stream_id, len(data))
            return
        stream.body += data
        if stream.inbox is not None:
            self._take_messages(stream_id, stream, len(data))
            return
        admitting = stream.declared < 0 and len(stream.body) >= PREFIX.size
        if admitting and not self._admit(stream_id, stream):
            self._session.consume(stream_id, len(data))
            return
        if stream.declared >= 0 and len(stream.body) > PREFIX.size + stream.declared:
            self._drop(stream_id, grpc.StatusCode.INVALID_ARGUMENT,
                       "a unary call carries exactly one message")  # fmt: skip
        self._session.consume(stream_id, len(data))  # admitted: its bytes are counted

    def _admit(self, stream_id: int, stream: _Stream) -> bool:
        """The unary message's prefix is in: check its length against the method's cap,
        the connection's and (inference) the agent's gate, before its bytes are read."""
        compressed, length = PREFIX.unpack_from(stream.body, 0)
        if compressed and not stream.encoding:
            self._drop(stream_id, grpc.StatusCode.INTERNAL,
                       "a compressed message without grpc-encoding")  # fmt: skip
            return False
        stream.compressed = bool(compressed)
        if length > stream.cap:
            self._drop(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"message of {length} bytes; the limit is {stream.cap}")  # fmt: skip
            return False
        if self._held + length > self._limits.max_connection_bytes:
            METRICS.shed.labels(reason="connection_bytes").inc()
            self._drop(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"this connection holds {self._held} bytes of requests, and "
                       f"{length} more would pass its limit; retry shortly")  # fmt: skip
            return False
        if stream.gated:
            try:
                stream.admitted = stream.context.admitted = self._door.gate.admit(length)
            except ServeError as exc:
                self._drop(stream_id, exc.grpc_code, exc.message, retry=exc.retry_after_s)
                return False
        stream.declared = length
        stream.held = length
        self._held += length
        limits = self._limits
        stream.deadline += length / limits.body_min_rate
        return True

    def _take_messages(self, stream_id: int, stream: _Stream, n: int) -> None:
        """A streaming call's complete messages go to its inbox; the window comes back
        only while the inbox is short, so a call that does not keep up stops its client."""
        assert stream.inbox is not None
        if len(stream.body) > stream.cap + PREFIX.size:
            self._drop(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"message larger than {stream.cap} bytes")  # fmt: skip
            return
        for message in self._messages(stream_id, stream) or ():
            stream.inbox.put_nowait(message)
        if stream.inbox.qsize() < self._limits.max_stream_messages:
            self._session.consume(stream_id, n + stream.unconsumed)
            stream.unconsumed = 0
        else:
            stream.unconsumed += n

    def _took_message(self, stream_id: int, stream: _Stream) -> None:
        """The streaming call took a message: give back the window held for it."""
        assert stream.inbox is not None
        if stream.unconsumed and stream.inbox.qsize() < self._limits.max_stream_messages:
            self._session.consume(stream_id, stream.unconsumed)
            stream.unconsumed = 0
            self._flush_soon()

    def on_end(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.inbox is not None:
            stream.inbox.put_nowait(None)
            return
        if stream.declared < 0 or len(stream.body) != PREFIX.size + stream.declared:
            self._drop(stream_id, grpc.StatusCode.INVALID_ARGUMENT,
                       "a unary call carries exactly one whole message")  # fmt: skip
            return
        # A view, not a copy (protobuf parses from it): the bytearray is never written
        # again, the stream's next body being a new one.
        message = memoryview(stream.body)[PREFIX.size :]
        stream.body = bytearray()
        stream.deadline = float("inf")  # the upload is over
        stream.task = self._door.spawn(self._call_unary(stream_id, stream, message))

    def on_close(self, stream_id: int, error_code: int) -> None:
        stream = self._forget(stream_id)
        if stream is not None and stream.task is not None and not stream.task.done():
            stream.task.cancel()  # the client reset it, or the connection went

    def on_control(self, kind: str) -> None:
        """A RST_STREAM, PING, SETTINGS or PRIORITY frame came: flood accounting and
        the keepalive policy."""
        if kind == "reset":
            if not self._resets.take():
                self._abuse("rapid_reset", b"too many stream resets")
            return
        if not self._control.take():
            self._abuse(f"{kind}_flood", f"too many {kind} frames".encode())
            return
        self._acks_due += ACK_BYTES.get(kind, 0)
        if kind == "ping":
            now = time.monotonic()
            early = now - self._last_ping < self._limits.min_ping_interval_s
            if early and not self._answered_since_ping:
                self._strikes += 1
                if self._strikes > MAX_PING_STRIKES:
                    self._abuse("too_many_pings", b"too_many_pings")
                    return
            self._last_ping, self._answered_since_ping = now, False

    def _abuse(self, reason: str, debug: bytes) -> None:
        """The client broke a limit: GOAWAY (ENHANCE_YOUR_CALM), close, penalise."""
        if self._closing:
            return
        log.info("closing the gRPC connection from %s: %s", self._peer, reason)
        self._door.limiter.penalise(self._client, reason)
        self._session.goaway(ENHANCE_YOUR_CALM, debug)
        self._flush()
        self.close(linger=True)

    def _on_tick(self) -> None:
        """Once a second: uploads past their deadline are refused, and a connection
        idle too long is told to go away."""
        self._tick = None
        if self._transport is None:
            return
        now = time.monotonic()
        late = [sid for sid, s in self._streams.items() if s.inbox is None and s.deadline < now]
        for stream_id in late:
            METRICS.door_refusals.labels(door="grpc", reason="body_timeout").inc()
            rate = self._limits.body_min_rate
            self._drop(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"the request message arrived slower than {rate} bytes/s")  # fmt: skip
        if late:
            self._flush()
        if self._streams:
            self._last_active = now
        elif now - self._last_active > self._limits.max_connection_idle_s:
            METRICS.door_refusals.labels(door="grpc", reason="idle_timeout").inc()
            self.goaway()
            self.close()
            return
        self._tick = self._loop.call_later(TICK_S, self._on_tick)

    def _forget(self, stream_id: int) -> _Stream | None:
        """The stream leaves the connection's books: its bytes and gate pass go back."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._held -= stream.held
            stream.held = 0
            if stream.admitted is not None:
                stream.admitted.release()
                stream.admitted = None
            if not self._streams:
                self._door.limiter.idle(self, self._client)
        return stream

    # --- requests -----------------------------------------------------------------------------

    def _messages(self, stream_id: int, stream: _Stream) -> list[tuple[bool, bytes]] | None:
        """Complete length-prefixed messages taken off the stream's buffer, each with
        its compressed flag."""
        out, body, at = [], stream.body, 0
        while len(body) - at >= PREFIX.size:
            compressed, length = PREFIX.unpack_from(body, at)
            if compressed and not stream.encoding:
                self._drop(stream_id, grpc.StatusCode.INTERNAL,
                           "a compressed message without grpc-encoding")  # fmt: skip
                return None
            if len(body) - at - PREFIX.size < length:
                break
            out.append(
                (bool(compressed), bytes(body[at + PREFIX.size : at + PREFIX.size + length]))
            )
            at += PREFIX.size + length
        del body[:at]
        return out

    async def _call_unary(
        self, stream_id: int, stream: _Stream, message: bytes | memoryview
    ) -> None:
        handler = stream.handler
        if stream.compressed:
            try:
                message = await self._inflate(stream, message)
            except Abort as exc:
                self._finish(stream_id, stream, exc.code, exc.details)
                return
            except ServeError as exc:  # the gate: the decompressed bytes do not fit
                self._finish(stream_id, stream, exc.grpc_code, exc.message)
                return
        try:
            request = handler.request_deserializer(message)
        except Exception as exc:  # protobuf's DecodeError and friends
            name = type(stream.handler).__name__
            self._finish(stream_id, stream, grpc.StatusCode.INVALID_ARGUMENT,
                         f"the request message does not parse: {exc or name}")  # fmt: skip
            return
        await self._answer(stream_id, stream, request, None)

    async def _call_streaming(self, stream_id: int, stream: _Stream) -> None:
        inbox = stream.inbox
        assert inbox is not None
        deserialize = stream.handler.request_deserializer

        async def requests() -> AsyncIterator[Any]:
            while (item := await inbox.get()) is not None:
                self._took_message(stream_id, stream)
                compressed, message = item
                if compressed:
                    message = await self._inflate(stream, message)
                try:
                    request = deserialize(message)
                except Exception as exc:  # protobuf's DecodeError and friends
                    raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"a request message does not parse: {exc}") from None  # fmt: skip
                yield request

        await self._answer(stream_id, stream, None, requests())

    async def _inflate(self, stream: _Stream, data: bytes | memoryview) -> bytes:
        """A compressed message, decompressed on a worker thread (a small message may
        hold a large one) and never past the method's cap; an inference message's
        decompressed bytes pass the agent's gate too."""
        message = await asyncio.to_thread(decompress, data, stream.encoding, stream.cap)
        if stream.admitted is not None:
            stream.admitted.grow(len(data) + len(message))
        return message

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
        if self._forget(stream_id) is None:
            return  # reset meanwhile
        self._answered_since_ping = True
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
        if self._forget(stream_id) is None:
            return
        self._answered_since_ping = True
        trailers = status_trailers(code, details) + stream.context.trailer_headers()
        with contextlib.suppress(HTTP2Error):
            if stream.started:
                self._session.send(stream_id, b"", True, trailers)
            else:  # trailers-only
                self._session.respond(stream_id, RESPONSE_HEADERS + trailers)
        self._flush_soon()

    def _refuse(self, stream_id: int, code: grpc.StatusCode, details: str,
                retry: float | None = None) -> None:  # fmt: skip
        trailers = status_trailers(code, details)
        if retry is not None:
            trailers.append((b"retry-after", f"{retry:g}".encode()))
        with contextlib.suppress(HTTP2Error):
            self._session.respond(stream_id, RESPONSE_HEADERS + trailers)
        self._flush_soon()

    def _drop(self, stream_id: int, code: grpc.StatusCode, details: str,
              retry: float | None = None) -> None:  # fmt: skip
        """End a call the request itself broke, whatever it was doing; a client still
        uploading is told to stop (RST_STREAM NO_ERROR after the status)."""
        stream = self._forget(stream_id)
        if stream is not None and stream.task is not None:
            stream.task.cancel()
        if stream is not None and stream.started:
            self._session.reset(stream_id, CANCEL)
        else:
            self._refuse(stream_id, code, details, retry)
            if stream is not None and stream.task is None:
                self._loop.call_soon(self._stop_upload, stream_id)

    def _stop_upload(self, stream_id: int) -> None:
        """RST_STREAM NO_ERROR for a call answered before its client finished sending,
        in a write after the one that carried the status: submitted with the status,
        grpc's C-core clients sometimes reported the call as INTERNAL ("Received
        RST_STREAM with error code 0") instead of the status (14 of 1,280 refused calls
        under load; none of 1,280 so)."""
        if self._closing:
            return
        self._session.reset(stream_id, NO_ERROR)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Responses finished in this loop iteration leave in one write."""
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        try:
            data = self._session.pending()
        except HTTP2Error as exc:
            log.debug("HTTP/2 error towards %s: %s", self._peer, exc)
            self.close()
            return
        acks, self._acks_due = self._acks_due, 0
        if data and self._transport is not None and not self._transport.is_closing():
            if len(data) > acks + CONTROL_FRAMES_BYTES:
                # Data is flowing to the client: the PINGs it sends meanwhile measure the
                # link (grpc's BDP probes), not keepalive abuse, as grpc's server counts them.
                self._answered_since_ping = True
            self._transport.write(data)

    def goaway(self) -> None:
        """Tell the client to go away; its streaming calls read no more messages, so
        each ends once the ones it has are answered (an idle stream at once) instead
        of holding the agent's shutdown for the whole grace period."""
        self._session.goaway(NO_ERROR)
        self._flush()
        for stream in self._streams.values():
            if stream.inbox is not None:
                stream.inbox.put_nowait(None)

    def close(self, linger: bool = False) -> None:
        """End the connection. With `linger`, after a GOAWAY: the write side is shut
        (the client reads the GOAWAY, then the end) and what the client still sends is
        read and dropped for LINGER_S before the socket closes; closing at once would
        answer those bytes with a reset that can destroy the GOAWAY unread."""
        self._closing = True
        transport = self._transport
        if transport is None:
            return
        if linger and not transport.is_closing() and transport.can_write_eof():
            transport.write_eof()
            self._loop.call_later(LINGER_S, transport.close)
            return
        transport.close()


class NativeGrpcDoor:
    """The server: a listening socket, its connections and their calls."""

    def __init__(self, register: Callable[[MethodTable], None], max_message: int,
                 gate: InflightGate, limits: DoorSettings) -> None:  # fmt: skip
        table = MethodTable()
        register(table)
        self.methods = table.methods
        self.max_message = max_message
        self.gate = gate
        self.limits = limits
        self.limiter = ConnectionLimiter("grpc", limits.max_connections,
                                         limits.max_connections_per_client,
                                         limits.abuse_penalty_s)  # fmt: skip
        self.connections: set[GrpcProtocol] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def spawn(self, call: Any) -> asyncio.Task[None]:
        assert self._loop is not None, "calls arrive only once the door listens"
        task = self._loop.create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self, host: str, port: int, ssl: SSLContext | None = None) -> int:
        """Listen; with `ssl` (its ALPN offering h2) the door serves gRPC over TLS."""
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GrpcProtocol(self), host, port, ssl=ssl, backlog=1024
        )
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
