"""A streaming call's requests served side by side (agent/frontdoor/stream_calls.py):
answers in request order, a sequence's requests run in arrival order while the
others run beside them, at most `limit` outstanding, and a failure ending the
call."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest

from edgeplex.agent.frontdoor.stream_calls import side_by_side, until_set


async def _requests(items: list[tuple[str | None, float, str]]) -> AsyncIterator[tuple]:
    for item in items:
        yield item


def _key(request: tuple) -> str | None:
    return request[0]


async def test_requests_run_side_by_side_and_answers_keep_request_order() -> None:
    done: list[str] = []

    async def serve(request: tuple) -> str:
        _, seconds, name = request
        await asyncio.sleep(seconds)
        done.append(name)
        return name

    items = [("s", 0.05, "s1"), (None, 0.0, "free"), ("s", 0.0, "s2"), ("t", 0.01, "t1")]
    answers = [a async for a in side_by_side(_requests(items), serve, 8, _key)]
    assert answers == ["s1", "free", "s2", "t1"]  # as the requests came
    # free and t1 ran beside the slow s1; s2, of s1's sequence, only after it.
    assert done == ["free", "t1", "s1", "s2"]


async def test_at_most_limit_are_served_at_once() -> None:
    running, most = 0, 0

    async def serve(request: tuple) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return request[2]

    items = [(None, 0.0, str(i)) for i in range(20)]
    answers = [a async for a in side_by_side(_requests(items), serve, 3, _key)]
    assert sorted(answers, key=int) == [str(i) for i in range(20)] and most == 3


async def test_a_failure_ends_the_call_after_the_answers_before_it() -> None:
    async def serve(request: tuple) -> str:
        if request[2] == "bad":
            raise RuntimeError("the handler failed")
        return request[2]

    got: list[str] = []
    with pytest.raises(RuntimeError, match="the handler failed"):
        async for answer in side_by_side(_requests([(None, 0, "ok"), (None, 0, "bad")]), serve,
                                         8, _key):  # fmt: skip
            got.append(answer)
    assert got == ["ok"]


async def test_until_set_ends_a_call_whose_client_sends_nothing_more() -> None:
    async def one_then_silence() -> AsyncIterator[int]:
        yield 1
        await asyncio.Event().wait()  # a client that keeps its stream open
        yield 2

    ending = asyncio.Event()
    got: list[int] = []

    async def read() -> None:
        async for item in until_set(one_then_silence(), ending):
            got.append(item)

    async def first_read() -> None:  # however slow the loop turns on a busy machine
        while not got:
            await asyncio.sleep(0.001)

    reading = asyncio.create_task(read())
    await asyncio.wait_for(first_read(), 5)
    await asyncio.sleep(0.01)  # a turn in which the silent stream could end it
    assert got == [1] and not reading.done()
    ending.set()
    await asyncio.wait_for(reading, 1)
    assert got == [1]


@pytest.mark.parametrize("closes", ["later", "meanwhile"])
async def test_a_call_cancelled_while_waiting_leaves_no_task_behind(closes: str) -> None:
    """The client cancels while until_set waits for its next message; the read it
    had started ends later, or at the same turn of the loop (the stream closes), and
    its end is not left for asyncio to report as never retrieved."""
    closed = asyncio.Event()

    async def silent_until_closed() -> AsyncIterator[int]:
        await closed.wait()
        return
        yield  # an async generator

    reported: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))

    async def read() -> None:
        async for _ in until_set(silent_until_closed(), asyncio.Event()):
            pass

    reading = asyncio.create_task(read())
    await asyncio.sleep(0.01)
    if closes == "meanwhile":
        closed.set()
    reading.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await reading
    closed.set()
    await asyncio.sleep(0.01)
    gc.collect()  # an unretrieved task's exception is reported when it is collected
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert not reported, reported
