"""Tensors through shared memory between the agent and one runner.

Each runner gets one shared mapping with two rings: requests (the agent
writes, the runner reads) and results (the runner writes, the agent reads).
A tensor payload past a threshold is written into its ring and the frame on
the socket carries only where it lies (`at`, `size`), so a batch costs one
socket write however large its tensors are: the frame is the doorbell.
Smaller payloads, and any that find their ring full, still travel inline in
the frame; nothing ever waits for ring space.

Who may reuse which bytes, without any shared counters:
- requests: the agent frees a batch's bytes when the runner's reply for it
  arrives (the runner has finished reading its inputs by then), in any order;
- results: the runner writes results in the order it sends them (under its
  send lock), the agent copies each one out as its frame arrives, and tells
  the runner how far it has read in the `consumed` field of its next Infer.

A frame names its ring bytes only once they are written, so a runner that dies
mid-write leaves nothing half-read: its mapping is dropped with it and the
next runner gets a fresh one. Offsets are positions on an ever-growing counter;
the bytes live at `position % capacity`, and a payload never wraps (the tail
of the ring is skipped instead).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import tempfile
import threading
from collections import deque
from pathlib import Path

from edgeplex.agent.runners.ipc import Infer, InferResult, Message, ProtocolError


def shm_dir() -> Path:
    """Where mappings are created: /dev/shm when it is usable, else the temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


class Ring:
    """Positions on one ring of `capacity` bytes. Not thread-safe: one writer."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.head = 0  # next position to hand out
        self.tail = 0  # oldest position still in use
        # (start, end) of allocations not yet freed, oldest first; freed ones are
        # marked by a negative end until everything before them is freed too.
        self._live: deque[list[int]] = deque()

    def reserve(self, size: int) -> int | None:
        """The position of `size` free contiguous bytes, or None if the ring is full."""
        if size <= 0 or size > self.capacity:
            return None
        pos = self.head
        offset = pos % self.capacity
        if offset + size > self.capacity:  # never wrap: skip to the ring's start
            pos += self.capacity - offset
        if pos + size - self.tail > self.capacity:
            return None
        self._live.append([self.head, pos + size])
        self.head = pos + size
        return pos

    def free(self, pos: int) -> None:
        """Free the allocation at `pos` (in any order)."""
        for entry in self._live:
            if entry[0] <= pos < abs(entry[1]):
                entry[1] = -abs(entry[1])
                break
        while self._live and self._live[0][1] < 0:
            self.tail = -self._live.popleft()[1]

    def consumed(self, upto: int) -> None:
        """Everything before position `upto` is free (results, read in order)."""
        if upto > self.head:
            raise ProtocolError("consumed past what was written")
        while self._live and self._live[0][1] <= upto:
            self._live.popleft()
        self.tail = max(self.tail, upto)


class Mapping:
    """The two rings of one runner over one shared mapping."""

    def __init__(self, fd: int, request_bytes: int, result_bytes: int) -> None:
        self._mmap = mmap.mmap(fd, request_bytes + result_bytes)
        view = memoryview(self._mmap)
        self.requests = view[:request_bytes]
        self.results = view[request_bytes:]
        self.request_ring = Ring(request_bytes)
        self.result_ring = Ring(result_bytes)

    @classmethod
    def create(
        cls, request_bytes: int, result_bytes: int, directory: Path | None = None
    ) -> tuple[Mapping, Path]:
        """A new mapping in a fresh file (mode 0600) in `directory` (default: shm_dir())
        that the runner opens by path."""
        path = (directory or shm_dir()) / f"edgeplex-{os.getpid()}-{secrets.token_hex(8)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            # Allocated now, not page by page as the rings fill: a full /dev/shm then
            # fails here (tensors use the socket), never as a SIGBUS mid-write.
            os.posix_fallocate(fd, 0, request_bytes + result_bytes)
            return cls(fd, request_bytes, result_bytes), path
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, path: str, request_bytes: int, result_bytes: int) -> Mapping:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_size != request_bytes + result_bytes:
                raise ProtocolError("shared memory of the wrong size")
            return cls(fd, request_bytes, result_bytes)
        finally:
            os.close(fd)

    def put(self, ring: Ring, view: memoryview, buffers: list[memoryview], size: int) -> int | None:
        """Copy `buffers` (`size` bytes) back to back into `ring`; their position, or None
        if full."""
        pos = ring.reserve(size)
        if pos is None:
            return None
        offset = pos % ring.capacity
        for buffer in buffers:
            view[offset : offset + buffer.nbytes] = buffer
            offset += buffer.nbytes
        return pos

    @staticmethod
    def span(ring: Ring, view: memoryview, pos: int, size: int) -> memoryview:
        """The `size` bytes at `pos` of a ring, checked to lie inside it."""
        offset = pos % ring.capacity
        if pos < 0 or size < 0 or offset + size > ring.capacity:
            raise ProtocolError("tensor bytes outside the shared ring")
        return view[offset : offset + size]

    def close(self) -> None:
        self.requests.release()
        self.results.release()
        with contextlib.suppress(BufferError):  # a view still lives; the GC unmaps it later
            self._mmap.close()


class AgentChannel:
    """The agent's end: puts large request payloads into the request ring, reads
    results out of the result ring, and frees what each reply releases."""

    def __init__(self, mapping: Mapping, threshold: int) -> None:
        self._map = mapping
        self._threshold = threshold
        self._held: dict[int, int] = {}  # req_id -> request ring position
        self._consumed = 0  # results read up to this position

    def send(self, message: Infer, buffers: list[memoryview], size: int) -> bool:
        """Route an Infer's payload of `size` bytes: True when it went into the ring
        (the frame then carries no payload), False when it stays inline."""
        message.consumed = self._consumed
        if size < self._threshold or not buffers:
            return False
        pos = self._map.put(self._map.request_ring, self._map.requests, buffers, size)
        if pos is None:
            return False
        message.at, message.size = pos, size
        self._held[message.req_id] = pos
        return True

    def received(self, message: Message, payload: memoryview) -> memoryview:
        """A reply's payload, copied out of the result ring when it lies there."""
        req_id = getattr(message, "req_id", None)
        pos = self._held.pop(req_id, None) if req_id is not None else None
        if pos is not None:
            self._map.request_ring.free(pos)
        if isinstance(message, InferResult) and message.at >= 0:
            if payload.nbytes or message.at < self._consumed:
                raise ProtocolError("result bytes both inline and shared, or out of order")
            ring = self._map.result_ring
            span = self._map.span(ring, self._map.results, message.at, message.size)
            payload = memoryview(bytes(span))  # copied out: the runner may reuse the bytes
            self._consumed = message.at + message.size
        return payload

    def close(self) -> None:
        self._map.close()


class RunnerChannel:
    """The runner's end: reads request payloads out of the request ring and puts
    large results into the result ring (call `send` under the send lock)."""

    def __init__(self, mapping: Mapping, threshold: int) -> None:
        self._map = mapping
        self._threshold = threshold
        self._lock = threading.Lock()  # the reader thread frees, workers reserve

    def received(self, message: Infer, payload: memoryview) -> memoryview:
        with self._lock:
            self._map.result_ring.consumed(message.consumed)
        if message.at < 0:
            return payload
        if payload.nbytes:
            raise ProtocolError("request bytes both inline and shared")
        return self._map.span(self._map.request_ring, self._map.requests, message.at, message.size)

    def send(self, message: InferResult, buffers: list[memoryview]) -> list[memoryview] | None:
        size = sum(b.nbytes for b in buffers)
        if size < self._threshold:
            return buffers
        with self._lock:
            pos = self._map.put(self._map.result_ring, self._map.results, buffers, size)
        if pos is None:
            return buffers
        message.at, message.size = pos, size
        return None
