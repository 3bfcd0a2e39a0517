"""The agent's end of one runner's socket: frames parsed as bytes arrive.

A `RunnerConnection` is the asyncio protocol of a connection on the runners'
socket. It reads straight into its own buffer (a frame too large for it gets
a buffer of its own, so large payloads are not copied twice) and hands each
complete frame to `on_frame` from within the loop's read callback: no reader
task sits between a runner's reply and the future waiting for it, which on
the hot path saves a loop iteration per reply.

The first frame of a connection is the runner's Hello; the pool matches it to
a spawned runner, which then receives every later frame. A connection that
says nothing within `hello_timeout_s`, or sends a frame that does not decode,
is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from edgeplex.agent.runners import framing, ipc

Frame = Callable[[ipc.Message, memoryview], None]
BUFFER_BYTES = 256 * 1024


class RunnerConnection(asyncio.BufferedProtocol):
    def __init__(
        self, on_hello: Callable[[RunnerConnection, ipc.Message], None], hello_timeout_s: float
    ) -> None:
        self._on_hello = on_hello
        self._hello_timeout_s = hello_timeout_s
        self.on_frame: Frame | None = None  # set once the Hello is accepted
        self.on_lost: Callable[[str], None] | None = None
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0  # first unread byte in _buf
        self._end = 0  # one past the last byte read into _buf
        # A frame larger than _buf: its header, and its payload read in place.
        self._big: tuple[ipc.Message, bytearray] | None = None
        self._big_have = 0
        self._hello_timer: asyncio.TimerHandle | None = None

    # --- asyncio's side -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.loop = asyncio.get_running_loop()  # held: each lookup is a getpid() call
        self._hello_timer = self.loop.call_later(self._hello_timeout_s, self.close)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return memoryview(self._big[1])[self._big_have :]
        if self._end == len(self._buf):  # full: move the unread part to the front
            pending = self._end - self._start
            self._buf[:pending] = self._buf[self._start : self._end]
            self._start, self._end = 0, pending
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._big is not None:
                self._big_have += nbytes
                self._finish_big()
            else:
                self._end += nbytes
                self._parse()
        except ipc.ProtocolError as exc:
            self._fail(f"bad frame: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self.on_lost is not None:
            self.on_lost("connection closed" if exc is None else str(exc))

    # --- ours -----------------------------------------------------------------------------

    def write(self, message: ipc.Message, buffers: list[memoryview] | None = None) -> None:
        assert self.transport is not None
        self.transport.writelines(framing.encode_frame(message, buffers))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _parse(self) -> None:
        head = ipc.FRAME_HEAD.size
        while self._end - self._start >= head:
            header_len, payload_len = framing.decode_head(
                self._view[self._start : self._start + head]
            )
            total = head + header_len + payload_len
            if total > len(self._buf):
                if head + header_len > len(self._buf):  # a header larger than the buffer
                    self._grow(head + header_len)
                if self._end - self._start >= head + header_len:
                    self._begin_big(header_len, payload_len)
                return
            if self._end - self._start < total:
                if self._start + total > len(self._buf):  # make room for the rest
                    pending = self._end - self._start
                    self._buf[:pending] = self._buf[self._start : self._end]
                    self._start, self._end = 0, pending
                return
            at = self._start + head
            message = framing.decode_header(self._view[at : at + header_len])
            at += header_len
            payload = memoryview(bytes(self._view[at : at + payload_len]) if payload_len else b"")
            self._start += total
            if self._start == self._end:
                self._start = self._end = 0
            self._deliver(message, payload)

    def _grow(self, size: int) -> None:
        pending = self._end - self._start
        grown = bytearray(size)
        grown[:pending] = self._view[self._start : self._end]
        self._buf, self._view = grown, memoryview(grown)
        self._start, self._end = 0, pending

    def _begin_big(self, header_len: int, payload_len: int) -> None:
        at = self._start + ipc.FRAME_HEAD.size
        message = framing.decode_header(self._view[at : at + header_len])
        at += header_len
        payload = bytearray(payload_len)
        have = min(payload_len, self._end - at)
        payload[:have] = self._view[at : at + have]
        self._start = self._end = 0
        self._big, self._big_have = (message, payload), have
        self._finish_big()

    def _finish_big(self) -> None:
        assert self._big is not None
        message, payload = self._big
        if self._big_have < len(payload):
            return
        self._big = None
        self._deliver(message, memoryview(payload))

    def _deliver(self, message: ipc.Message, payload: memoryview) -> None:
        if self.on_frame is not None:
            self.on_frame(message, payload)
            return
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        self._on_hello(self, message)
        if self.on_frame is None:  # not accepted
            self.close()

    def _fail(self, reason: str) -> None:
        on_lost, self.on_lost = self.on_lost, None
        self.close()
        if on_lost is not None:
            on_lost(reason)


def drop(*_: Any) -> None:
    """on_frame of a connection whose runner has gone: frames are ignored."""
