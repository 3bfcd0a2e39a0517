"""The agent's end of a runner's socket: frames parsed as bytes arrive, however the
stream is cut, and a stream that is not frames ends the connection. Over a real
socket pair on the running loop."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from edgeplex.agent.runners import connection, framing, ipc
from edgeplex.agent.runners.awake import AwakeWaits


def frame_bytes(message: ipc.Message, arrays: dict[str, np.ndarray] | None = None) -> bytes:
    buffers: list[memoryview] = []
    if arrays:
        message.tensors, buffers = framing.pack_tensors(arrays)  # type: ignore[attr-defined]
    parts = framing.encode_frame(message, buffers)
    return b"".join(bytes(p) for p in parts)


class Peer:
    """A RunnerConnection on one end of a socket pair; the test writes the other."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn: connection.RunnerConnection
        self.hellos: list[ipc.Message] = []
        self.frames: list[tuple[ipc.Message, bytes]] = []
        self.lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def send_in_pieces(self, data: bytes, piece: int) -> None:
        loop = asyncio.get_running_loop()
        for at in range(0, len(data), piece):
            await loop.sock_sendall(self.sock, data[at : at + piece])
            if at // piece % 16 == 0:
                await asyncio.sleep(0)  # let the loop read what is there so far

    async def hello(self) -> None:
        for _ in range(2000):
            if self.hellos:
                return
            await asyncio.sleep(0.001)
        raise AssertionError("no hello")

    async def until(self, count: int) -> None:
        for _ in range(2000):
            if len(self.frames) >= count:
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"{len(self.frames)} frames arrived, {count} expected")


async def open_peer(hello_timeout_s: float = 5.0, accepting: bool = True) -> Peer:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    peer = Peer(theirs)

    def on_hello(conn: connection.RunnerConnection, message: ipc.Message) -> None:
        peer.hellos.append(message)
        if accepting:  # as the pool does: within the callback, or the connection closes
            conn.on_frame = lambda m, p: peer.frames.append((m, bytes(p)))
            conn.on_lost = lambda reason: peer.lost.done() or peer.lost.set_result(reason)

    peer.conn = connection.RunnerConnection(on_hello, hello_timeout_s)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: peer.conn, ours)
    return peer


async def closed(sock: socket.socket) -> bool:
    """Whether the other end closes within a few seconds."""
    data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 10), 5)
    return data == b""


@pytest.mark.parametrize("piece", [7, 1000, 4096, 1 << 20])
async def test_frames_arrive_whole_however_the_stream_is_cut(piece):
    peer = await open_peer()
    rng = np.random.default_rng(0)
    small = {"x": rng.standard_normal((1, 64), dtype=np.float32)}
    # Larger than the connection's buffer: read into a buffer of its own.
    big = {"y": rng.standard_normal((300, 256), dtype=np.float32)}
    hello = frame_bytes(ipc.Hello("r1", 42))
    stream = frame_bytes(ipc.InferResult(1, 10, [], ""), small)
    stream += frame_bytes(ipc.InferResult(2, 20, [], ""), big)
    stream += frame_bytes(ipc.Unloaded(3))
    await peer.send_in_pieces(hello, piece)
    await peer.hello()
    await peer.send_in_pieces(stream, piece)
    await peer.until(3)
    (m1, p1), (m2, p2), (m3, p3) = peer.frames
    assert isinstance(m1, ipc.InferResult) and m1.req_id == 1
    assert p1 == small["x"].tobytes()
    assert isinstance(m2, ipc.InferResult) and m2.req_id == 2
    assert p2 == big["y"].tobytes()
    assert isinstance(m3, ipc.Unloaded) and p3 == b""
    peer.conn.close()


async def test_a_header_larger_than_the_buffer_is_read_whole():
    peer = await open_peer()
    message = ipc.Failure(9, "internal", "x" * (connection.BUFFER_BYTES + 1000))
    await peer.send_in_pieces(frame_bytes(ipc.Hello("r1", 42)), 1 << 20)
    await peer.hello()
    await peer.send_in_pieces(frame_bytes(message), 50_000)
    await peer.until(1)
    assert peer.frames[0][0] == message
    peer.conn.close()


async def test_garbage_ends_the_connection_and_says_why():
    peer = await open_peer()
    await peer.send_in_pieces(frame_bytes(ipc.Hello("r1", 42)), 1 << 20)
    await peer.hello()
    head = ipc.FRAME_HEAD.pack(5, 0)
    await peer.send_in_pieces(head + b"\xc1\xc1\xc1\xc1\xc1", 100)  # not msgpack
    reason = await asyncio.wait_for(peer.lost, 5)
    assert "bad frame" in reason
    assert await closed(peer.sock)  # from the agent's end


async def test_an_oversized_frame_ends_the_connection():
    peer = await open_peer()
    await peer.send_in_pieces(frame_bytes(ipc.Hello("r1", 42)), 1 << 20)
    await peer.hello()
    await peer.send_in_pieces(ipc.FRAME_HEAD.pack(ipc.MAX_HEADER_BYTES + 1, 0), 100)
    assert "too large" in await asyncio.wait_for(peer.lost, 5)


async def test_a_connection_that_never_says_hello_is_closed():
    peer = await open_peer(hello_timeout_s=0.05)
    assert await closed(peer.sock)


async def test_a_connection_whose_hello_is_refused_is_closed():
    peer = await open_peer(accepting=False)
    await peer.send_in_pieces(frame_bytes(ipc.Unloaded(1)), 100)  # not even a Hello
    assert await closed(peer.sock)


# --- waiting awake --------------------------------------------------------------------------


async def test_the_loop_polls_only_for_the_one_quick_batch_in_flight():
    loop = asyncio.get_running_loop()
    awake = AwakeWaits(budget_us=50_000)
    polls = 0
    real_call_soon = loop.call_soon

    def counting(callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal polls
        polls += getattr(callback, "__name__", "") == "poll"
        return real_call_soon(callback, *args, **kwargs)

    loop.call_soon = counting  # type: ignore[method-assign]
    try:
        first = loop.create_future()
        awake.sent(first, recent_round_trip_s=0.0001)
        await asyncio.sleep(0.005)
        assert polls > 10  # polling while the reply is out
        first.set_result(None)
        await asyncio.sleep(0)
        awake.answered()
        settled = polls
        await asyncio.sleep(0.005)
        assert polls <= settled + 1  # the answer stops it

        slow = loop.create_future()
        awake.sent(slow, recent_round_trip_s=0.1)  # a model slower than the budget
        other = loop.create_future()
        awake.sent(other, recent_round_trip_s=0.0)  # a second batch in flight
        before = polls
        await asyncio.sleep(0.005)
        assert polls == before
        awake.answered()
        awake.answered()
        assert awake.in_flight == 0
    finally:
        loop.call_soon = real_call_soon  # type: ignore[method-assign]
