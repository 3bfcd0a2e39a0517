"""Frames on the agent's, the zygote's and the runners' sockets.

A frame is `u32 header_len | u32 payload_len | header | payload`: the header
is a msgpack map with a type tag `t` (a message of ipc.py), the payload the
raw bytes of the tensors the header describes, back to back. Only the plain
numeric dtypes of TENSOR_DTYPES decode, and BYTES (length-prefixed UTF-8
elements), so a peer can send nothing but data.

The blocking helpers (send_frame, recv_frame) serve the runner and the zygote;
the asyncio ones (read_frame, write_frame) serve the agent.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.tensors import BYTES, byte_view, decode_bytes, encode_bytes
from edgeplex.agent.runners.ipc import (
    FRAME_HEAD,
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    TENSOR_DTYPES,
    Message,
    ProtocolError,
    message_from_header,
)

if TYPE_CHECKING:
    from edgeplex.agent.runners.idle_spin import IdleSpin

# --- tensors ------------------------------------------------------------------------------


def pack_tensors(arrays: dict[str, np.ndarray]) -> tuple[list[list[Any]], list[memoryview]]:
    """Header descriptors and payload buffers for named arrays (no copy when contiguous)."""
    descs: list[list[Any]] = []
    buffers: list[memoryview] = []
    for name, array in arrays.items():
        if array.dtype == object:  # BYTES: length-prefixed UTF-8 elements
            try:
                blob = encode_bytes(array)
            except TypeError as exc:
                raise ProtocolError(f"tensor '{name}': {exc}") from None
            descs.append([name, BYTES, list(array.shape), len(blob)])
            buffers.append(memoryview(blob))
            continue
        array = np.ascontiguousarray(array)
        if array.dtype.str not in TENSOR_DTYPES:
            raise ProtocolError(f"tensor '{name}': dtype {array.dtype} cannot cross IPC")
        descs.append([name, array.dtype.str, list(array.shape), array.nbytes])
        buffers.append(byte_view(array))
    return descs, buffers


def unpack_tensors(descs: list[list[Any]], payload: memoryview) -> dict[str, np.ndarray]:
    """Arrays viewing `payload` (no copy); validates every descriptor."""
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype_str, shape, nbytes in descs:
        if dtype_str == BYTES and offset + nbytes <= len(payload):
            try:
                arrays[name] = decode_bytes(name, shape, payload[offset : offset + nbytes], nbytes)
            except InvalidInput as exc:
                raise ProtocolError(str(exc)) from None
            offset += nbytes
            continue
        if dtype_str not in TENSOR_DTYPES:
            raise ProtocolError(f"tensor '{name}': dtype {dtype_str!r} not allowed")
        dtype = np.dtype(dtype_str)
        count = 1
        for d in shape:
            count *= d
        if count * dtype.itemsize != nbytes or offset + nbytes > len(payload):
            raise ProtocolError(f"tensor '{name}': size does not match its shape")
        arrays[name] = np.frombuffer(payload, dtype=dtype, count=count, offset=offset).reshape(
            shape
        )
        offset += nbytes
    return arrays


# --- framing --------------------------------------------------------------------------------


def encode_frame(message: Message, buffers: list[memoryview] | None = None) -> list[Any]:
    header = msgpack.packb(message.to_header())
    payload_len = sum(b.nbytes for b in buffers) if buffers else 0
    return [FRAME_HEAD.pack(len(header), payload_len), header, *(buffers or ())]


def decode_head(head: bytes | memoryview) -> tuple[int, int]:
    header_len, payload_len = FRAME_HEAD.unpack(head)
    if header_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError("frame too large")
    return header_len, payload_len


def decode_header(raw: bytes | bytearray | memoryview) -> Message:
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable header: {exc}") from None
    return message_from_header(header)


def send_frame(
    sock: socket.socket, message: Message, buffers: list[memoryview] | None = None
) -> None:
    """Blocking send of one frame; the caller serialises concurrent senders."""
    parts = [
        memoryview(p).cast("B") if not isinstance(p, memoryview) else p
        for p in encode_frame(message, buffers)
    ]
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= parts[0].nbytes:
            sent -= parts[0].nbytes
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]


class FrameReader:
    """Blocking frame reader over a socket, buffered so that a small frame costs one
    recv() instead of three. One reader per socket; not thread-safe. With `spin`,
    a wait for the next frame may poll before it blocks (idle_spin.py)."""

    def __init__(
        self,
        sock: socket.socket,
        buffer_size: int = 256 * 1024,
        spin: IdleSpin | None = None,
    ) -> None:
        self._sock = sock
        self._spin = spin
        self._buf = bytearray(buffer_size)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0

    @property
    def pending(self) -> bool:
        """Whether bytes of a next frame are already buffered."""
        return self._end > self._start

    def _fill(self, n: int) -> None:
        """Make at least n bytes available from self._start (n <= buffer size)."""
        if self._end - self._start >= n:
            return
        if self._start + n > len(self._buf):
            pending = self._end - self._start
            self._buf[:pending] = self._buf[self._start : self._end]
            self._start, self._end = 0, pending
        if self._spin is not None and self._end == self._start:
            self._start = self._end = 0
            k = self._spin.recv_into(self._sock, self._view[self._end :])
            if k == 0:
                raise EOFError("peer closed the connection")
            self._end += k or 0
        while self._end - self._start < n:
            k = self._sock.recv_into(self._view[self._end :])
            if k == 0:
                raise EOFError("peer closed the connection")
            self._end += k

    def _take(self, n: int) -> memoryview | bytearray:
        if n <= len(self._buf):
            self._fill(n)
            out = bytes(self._view[self._start : self._start + n])
            self._start += n
            return memoryview(out)
        # Larger than the buffer: copy what is buffered, then read the rest directly.
        out_buf = bytearray(n)
        have = min(n, self._end - self._start)
        out_buf[:have] = self._view[self._start : self._start + have]
        self._start += have
        view = memoryview(out_buf)
        while have < n:
            k = self._sock.recv_into(view[have:], n - have)
            if k == 0:
                raise EOFError("peer closed the connection")
            have += k
        return view

    def read(self) -> tuple[Message, memoryview]:
        self._fill(FRAME_HEAD.size)
        header_len, payload_len = decode_head(
            bytes(self._view[self._start : self._start + FRAME_HEAD.size])
        )
        self._start += FRAME_HEAD.size
        message = decode_header(self._take(header_len))
        payload = self._take(payload_len) if payload_len else memoryview(b"")
        return message, memoryview(payload)


def recv_frame(sock: socket.socket) -> tuple[Message, memoryview]:
    """Unbuffered blocking receive of one frame (for sockets read once or rarely)."""
    return FrameReader(sock, buffer_size=FRAME_HEAD.size).read()


async def read_frame(reader: asyncio.StreamReader) -> tuple[Message, memoryview]:
    header_len, payload_len = decode_head(await reader.readexactly(FRAME_HEAD.size))
    message = decode_header(await reader.readexactly(header_len))
    payload = await reader.readexactly(payload_len) if payload_len else b""
    return message, memoryview(payload)


def write_frame(
    writer: asyncio.StreamWriter, message: Message, buffers: list[memoryview] | None = None
) -> None:
    """Queue one frame on the transport (call from the event loop; no await needed)."""
    writer.writelines(encode_frame(message, buffers))
