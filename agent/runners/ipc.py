"""Typed messages between the agent, the zygote and the runners. No pickle.

A frame is `u32 header_len | u32 payload_len | header | payload`: the header
is a msgpack map with a type tag `t`, the payload the raw bytes of the tensors
the header describes, back to back. Both ends decode only the message classes
below and only the plain numeric dtypes of TENSOR_DTYPES, so a peer can send
nothing but data.

The blocking helpers (send_frame, recv_frame) serve the runner and the zygote;
the asyncio ones (read_frame, write_frame) serve the agent.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import msgpack
import numpy as np

FRAME_HEAD = struct.Struct("<II")
MAX_HEADER_BYTES = 1 * 1024 * 1024
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024 * 1024

TENSOR_DTYPES = frozenset(
    np.dtype(t).str
    for t in ("?", "u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "<f2", "<f4", "<f8")
)


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame or message."""


# --- messages -----------------------------------------------------------------------------

_REGISTRY: dict[str, type[Message]] = {}
M = TypeVar("M", bound="Message")


@dataclass(slots=True)
class Message:
    TAG: ClassVar[str] = ""

    def to_header(self) -> dict[str, Any]:
        header = {f.name: getattr(self, f.name) for f in fields(self)}
        header["t"] = self.TAG
        return header


def _message(cls: type[M]) -> type[M]:
    """Class decorator: a slotted dataclass registered under its TAG."""
    made = dataclass(slots=True)(cls)
    _REGISTRY[made.TAG] = made
    return made


def message_from_header(header: Any) -> Message:
    if not isinstance(header, dict) or header.get("t") not in _REGISTRY:
        raise ProtocolError("unknown message")
    cls = _REGISTRY[header.pop("t")]
    try:
        return cls(**header)
    except TypeError as exc:
        raise ProtocolError(f"bad {cls.TAG} message: {exc}") from None


@_message
class Hello(Message):
    """runner -> agent, first frame on a new connection."""

    TAG: ClassVar[str] = "hello"
    runner_id: str
    pid: int


@_message
class LoadModel(Message):
    """agent -> runner: create a session. Answered by ModelLoaded or Failure."""

    TAG: ClassVar[str] = "load"
    req_id: int
    model: str
    # The verified model file (cached tier).
    path: str
    # Where the pre-optimized copy lives (staged tier, in host RAM): used when it
    # exists, else written from `path` first.
    staged_dir: str
    intra_op_threads: int
    inter_op_threads: int
    allow_spinning: bool
    prepack_weights: bool
    # "cpu" or "cuda"; with cuda, memory_limit (bytes, 0 = none) caps the arena.
    provider: str
    device_id: int
    memory_limit: int
    # Worker threads that may run this model's batches concurrently.
    instances: int
    # Run once on synthetic inputs before answering. Skipped for a promotion that
    # requests wait for: their first batch does the same work, and sooner.
    warm_up: bool = True


@_message
class ModelLoaded(Message):
    TAG: ClassVar[str] = "loaded"
    req_id: int
    model: str
    # [name, ORT type string, shape with -1 for dynamic dims]
    inputs: list[list[Any]]
    outputs: list[list[Any]]
    # Growth of the runner's resident memory across session creation and warm-up.
    bytes: int
    load_ms: float
    # Tier the load started from ("staged" or "cached") and its stages in ms:
    # read, optimize, create, warmup.
    source: str
    stages: dict[str, float]
    # Bytes of the staged copy (graph + weights) in host RAM.
    staged_bytes: int
    # Whether the session was created with prepacked weights.
    prepacked: bool


@_message
class StageModel(Message):
    """agent -> runner: cached -> staged only (no session). Answered by ModelStaged
    or Failure. Runs on its own thread, so promotions never queue behind it."""

    TAG: ClassVar[str] = "stage"
    req_id: int
    model: str
    path: str
    staged_dir: str


@_message
class ModelStaged(Message):
    TAG: ClassVar[str] = "staged"
    req_id: int
    staged_bytes: int
    stages: dict[str, float]


@_message
class Prepack(Message):
    """agent -> runner: rebuild `model`'s session with ORT's weight prepacking and swap
    it in (the model keeps serving meanwhile). Answered by Prepacked or Failure."""

    TAG: ClassVar[str] = "prepack"
    req_id: int
    model: str


@_message
class Prepacked(Message):
    TAG: ClassVar[str] = "prepacked"
    req_id: int
    # Change of the runner's measured memory across the swap (may be negative).
    bytes_delta: int
    ms: float


@_message
class SetInstances(Message):
    """agent -> runner: run `model` on this many worker threads. Answered by
    InstancesSet."""

    TAG: ClassVar[str] = "instances"
    req_id: int
    model: str
    instances: int


@_message
class InstancesSet(Message):
    TAG: ClassVar[str] = "instances_set"
    req_id: int
    instances: int


@_message
class UnloadModel(Message):
    TAG: ClassVar[str] = "unload"
    req_id: int
    model: str


@_message
class Unloaded(Message):
    TAG: ClassVar[str] = "unloaded"
    req_id: int


@_message
class Infer(Message):
    """agent -> runner: run one (batched) execution; tensors travel in the payload."""

    TAG: ClassVar[str] = "infer"
    req_id: int
    model: str
    outputs: list[str] | None
    tensors: list[list[Any]] = field(default_factory=list)


@_message
class InferResult(Message):
    TAG: ClassVar[str] = "result"
    req_id: int
    compute_ns: int
    tensors: list[list[Any]] = field(default_factory=list)


@_message
class Failure(Message):
    """runner -> agent: the request `req_id` failed. kind: invalid | internal | not_loaded."""

    TAG: ClassVar[str] = "failure"
    req_id: int
    kind: str
    message: str


@_message
class SpawnRunner(Message):
    """agent -> zygote: fork a runner that connects to `socket_path`."""

    TAG: ClassVar[str] = "spawn"
    runner_id: str
    socket_path: str
    log_level: str
    # RLIMIT_AS the child sets on itself before it starts (0 = none).
    rlimit_as: int


@_message
class RunnerSpawned(Message):
    TAG: ClassVar[str] = "spawned"
    runner_id: str
    pid: int


@_message
class RunnerExited(Message):
    """zygote -> agent: a runner process ended; `status` as os.waitstatus_to_exitcode."""

    TAG: ClassVar[str] = "exited"
    runner_id: str
    pid: int
    status: int


@_message
class KillRunner(Message):
    """agent -> zygote: send `signal` to a runner (used on shutdown and when stuck)."""

    TAG: ClassVar[str] = "kill"
    runner_id: str
    signal: int


# --- tensors ------------------------------------------------------------------------------


def pack_tensors(arrays: dict[str, np.ndarray]) -> tuple[list[list[Any]], list[memoryview]]:
    """Header descriptors and payload buffers for named arrays (no copy when contiguous)."""
    descs: list[list[Any]] = []
    buffers: list[memoryview] = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        if array.dtype.str not in TENSOR_DTYPES:
            raise ProtocolError(f"tensor '{name}': dtype {array.dtype} cannot cross IPC")
        descs.append([name, array.dtype.str, list(array.shape), array.nbytes])
        buffers.append(memoryview(array).cast("B"))  # type: ignore[arg-type]
    return descs, buffers


def unpack_tensors(descs: list[list[Any]], payload: memoryview) -> dict[str, np.ndarray]:
    """Arrays viewing `payload` (no copy); validates every descriptor."""
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype_str, shape, nbytes in descs:
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


def _decode_head(head: bytes) -> tuple[int, int]:
    header_len, payload_len = FRAME_HEAD.unpack(head)
    if header_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError("frame too large")
    return header_len, payload_len


def _decode_header(raw: bytes | bytearray | memoryview) -> Message:
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
    recv() instead of three. One reader per socket; not thread-safe."""

    def __init__(self, sock: socket.socket, buffer_size: int = 256 * 1024) -> None:
        self._sock = sock
        self._buf = bytearray(buffer_size)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0

    def _fill(self, n: int) -> None:
        """Make at least n bytes available from self._start (n <= buffer size)."""
        if self._end - self._start >= n:
            return
        if self._start + n > len(self._buf):
            pending = self._end - self._start
            self._buf[:pending] = self._buf[self._start : self._end]
            self._start, self._end = 0, pending
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
        header_len, payload_len = _decode_head(
            bytes(self._view[self._start : self._start + FRAME_HEAD.size])
        )
        self._start += FRAME_HEAD.size
        message = _decode_header(self._take(header_len))
        payload = self._take(payload_len) if payload_len else memoryview(b"")
        return message, memoryview(payload)


def recv_frame(sock: socket.socket) -> tuple[Message, memoryview]:
    """Unbuffered blocking receive of one frame (for sockets read once or rarely)."""
    return FrameReader(sock, buffer_size=FRAME_HEAD.size).read()


async def read_frame(reader: asyncio.StreamReader) -> tuple[Message, memoryview]:
    header_len, payload_len = _decode_head(await reader.readexactly(FRAME_HEAD.size))
    message = _decode_header(await reader.readexactly(header_len))
    payload = await reader.readexactly(payload_len) if payload_len else b""
    return message, memoryview(payload)


def write_frame(
    writer: asyncio.StreamWriter, message: Message, buffers: list[memoryview] | None = None
) -> None:
    """Queue one frame on the transport (call from the event loop; no await needed)."""
    writer.writelines(encode_frame(message, buffers))
