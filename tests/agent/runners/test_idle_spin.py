"""A runner polling for its next frame: it takes a frame that arrives within the
budget without sleeping, backs off when polls find nothing, and never polls
while it has other work or the agent is under load."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from edgeplex.agent.runners import framing, ipc
from edgeplex.agent.runners.idle_spin import MAX_CREDIT, MISS_COST, IdleSpin


def polling(budget_us: int, quiet=lambda: True, invited: bool = True) -> IdleSpin:
    spin = IdleSpin(budget_us, quiet)
    spin.invited = invited
    return spin


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_a_frame_arriving_within_the_budget_is_taken_by_the_poll(pair):
    reader, writer = pair
    buf = memoryview(bytearray(64))
    thread = threading.Thread(target=lambda: (time.sleep(0.01), writer.sendall(b"hello")))
    thread.start()
    assert polling(500_000).recv_into(reader, buf) == 5
    thread.join()
    assert bytes(buf[:5]) == b"hello"


def test_empty_polls_spend_the_credit_then_back_off(pair):
    reader, _ = pair
    quiet_calls = []
    spin = polling(200, quiet=lambda: quiet_calls.append(1) or True)
    buf = memoryview(bytearray(64))
    spin._credit = MAX_CREDIT
    polls_on_credit = MAX_CREDIT // MISS_COST
    for _ in range(polls_on_credit):  # a stream's occasional stall: still polling
        assert spin.recv_into(reader, buf) is None
    assert len(quiet_calls) == polls_on_credit
    # Credit gone: each empty poll doubles the waits that block without polling.
    polled = []
    for _ in range(2 + 1 + 4 + 1 + 1):
        before = len(quiet_calls)
        assert spin.recv_into(reader, buf) is None
        polled.append(len(quiet_calls) > before)
    assert polled == [True, False, False, True, False, False, False, False, True]


def test_a_found_frame_ends_the_back_off(pair):
    reader, writer = pair
    spin = polling(200)
    buf = memoryview(bytearray(64))
    assert spin.recv_into(reader, buf) is None  # empty: the next 2 waits block
    writer.sendall(b"x")
    assert spin.recv_into(reader, buf) is None
    assert spin.recv_into(reader, buf) is None
    assert spin.recv_into(reader, buf) == 1  # polled again, and found it
    writer.sendall(b"y")
    assert spin.recv_into(reader, buf) == 1  # no back-off left


def test_no_poll_under_load_with_other_work_or_when_disabled(pair):
    reader, writer = pair
    writer.sendall(b"waiting")
    buf = memoryview(bytearray(64))
    assert polling(100_000, invited=False).recv_into(reader, buf) is None
    assert polling(100_000, quiet=lambda: False).recv_into(reader, buf) is None
    assert polling(0).recv_into(reader, buf) is None
    assert reader.recv(64) == b"waiting"  # nothing was consumed


def test_a_closed_peer_reads_as_end_of_stream(pair):
    reader, writer = pair
    writer.close()
    assert polling(100_000).recv_into(reader, memoryview(bytearray(8))) == 0
    with pytest.raises(EOFError):
        framing.FrameReader(reader, spin=polling(100_000)).read()


def test_frames_read_through_a_polling_reader_are_whole(pair):
    reader, writer = pair
    frames = framing.FrameReader(reader, buffer_size=64, spin=polling(50_000))
    sent = [ipc.Unloaded(i) for i in range(50)]
    blob = b"".join(
        b"".join(bytes(memoryview(p).cast("B")) for p in framing.encode_frame(m)) for m in sent
    )

    def dribble() -> None:  # pieces that split heads and headers, some within the budget
        for start in range(0, len(blob), 7):
            writer.sendall(blob[start : start + 7])
            if start % 5 == 0:
                time.sleep(0.0005)

    thread = threading.Thread(target=dribble)
    thread.start()
    got = [frames.read()[0] for _ in sent]
    thread.join()
    assert got == sent
