"""The batcher's mechanism with a stand-in `execute` at the runner boundary."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edgeplex.agent.batching.batcher import Batcher
from edgeplex.agent.batching.policy import Request, batch_key
from edgeplex.agent.observability.stats import ModelStats
from edgeplex.agent.oip.errors import InferenceFailed, QueueFull, RunnerLost, Unavailable


def make_request(
    loop: asyncio.AbstractEventLoop, rows: int = 1, value: float = 1.0, timeout: float = 5.0
) -> Request:
    inputs = {"x": np.full((rows, 2), value, np.float32)}
    return Request(
        inputs=inputs,
        outputs=None,
        batch_size=rows,
        key=batch_key(inputs, True),
        deadline=loop.time() + timeout,
        future=loop.create_future(),
    )


def batcher(
    execute,
    *,
    ready=None,
    max_batch=8,
    delay_us=0,
    queue=16,
    instances=1,
    preferred=(),
    level_caps=None,
) -> Batcher:
    if ready is None:
        ready = asyncio.Event()
        ready.set()
    return Batcher(
        "m",
        max_batch_size=max_batch,
        max_queue_delay_us=delay_us,
        max_queue_size=queue,
        level_caps=level_caps,
        preferred_batch_sizes=preferred,
        instance_count=instances,
        execute=execute,
        ready=ready,
        stats=ModelStats(),
    )


async def test_requests_queued_while_busy_share_one_batch_and_get_their_rows():
    calls = []
    gate = asyncio.Event()

    async def execute(inputs, outputs):
        calls.append(inputs["x"].shape[0])
        await gate.wait()
        return {"y": inputs["x"] * 2}, 1000, ""

    loop = asyncio.get_running_loop()
    b = batcher(execute)
    first = make_request(loop)
    b.submit(first)
    await asyncio.sleep(0)
    rest = [make_request(loop, rows=r, value=v) for r, v in ((1, 2.0), (2, 3.0))]
    for r in rest:
        b.submit(r)
    gate.set()
    results = await asyncio.gather(first.future, *(r.future for r in rest))
    assert calls == [1, 3]
    assert results[2]["y"].shape == (2, 2) and float(results[2]["y"][0, 0]) == 6.0
    await b.close(Unavailable("done"), drain=True)


@pytest.mark.parametrize("preferred", [(), (4,)])
async def test_a_preferred_size_goes_at_once_and_the_rest_waits_out_the_delay(preferred):
    """With a long delay (2 s) and room for 8, five requests: with preferred size 4,
    four go at once and the fifth after the delay; without, all five after it."""
    calls: list[tuple[int, float]] = []
    loop = asyncio.get_running_loop()

    async def execute(inputs, outputs):
        calls.append((inputs["x"].shape[0], loop.time() - started))
        return {"y": inputs["x"]}, 1000, ""

    b = batcher(execute, delay_us=2_000_000, preferred=preferred)
    started = loop.time()
    requests = [make_request(loop) for _ in range(5)]
    for r in requests:
        b.submit(r)
    await asyncio.wait_for(requests[0].future, 5)
    if preferred:
        assert len(calls) == 1 and calls[0][0] == 4 and calls[0][1] < 0.5, calls
    else:
        assert calls[0][0] == 5 and calls[0][1] >= 1.9, calls
    await asyncio.wait_for(asyncio.gather(*(r.future for r in requests)), 5)
    assert sum(n for n, _ in calls) == 5 and calls[-1][1] >= 1.9, calls
    await b.close(Unavailable("done"), drain=True)


async def test_a_higher_priority_goes_ahead_of_every_lower_one_queued():
    """While the model is busy: two requests of level 2, one of level 1, one more of
    level 2, then one of level 1. They run level 1 first, each level in arrival order."""
    order: list[float] = []
    gate = asyncio.Event()

    async def execute(inputs, outputs):
        order.append(float(inputs["x"][0, 0]))
        await gate.wait()
        return {"y": inputs["x"]}, 1000, ""

    loop = asyncio.get_running_loop()
    b = batcher(execute, max_batch=1)
    busy = make_request(loop, value=0.0)
    b.submit(busy)
    queued = []
    for value, level in ((1.0, 2), (2.0, 2), (3.0, 1), (4.0, 2), (5.0, 1)):
        request = make_request(loop, value=value)
        request.priority = level
        b.submit(request)
        queued.append(request)
    gate.set()
    await asyncio.gather(busy.future, *(r.future for r in queued))
    assert order == [0.0, 3.0, 5.0, 1.0, 2.0, 4.0]
    await b.close(Unavailable("done"), drain=True)


async def test_a_failed_batch_fails_every_member_with_the_same_error():
    gate = asyncio.Event()

    async def execute(inputs, outputs):
        await gate.wait()
        raise InferenceFailed("boom")

    loop = asyncio.get_running_loop()
    b = batcher(execute)
    first = make_request(loop)
    b.submit(first)  # starts alone, at once
    await asyncio.sleep(0)
    batch = [make_request(loop) for _ in range(3)]  # queue behind it: one batch
    for r in batch:
        b.submit(r)
    gate.set()
    await asyncio.gather(first.future, return_exceptions=True)
    errors = await asyncio.gather(*(r.future for r in batch), return_exceptions=True)
    assert len({id(e) for e in errors}) == 1 and isinstance(errors[0], InferenceFailed)
    await b.close(Unavailable("done"), drain=False)


async def test_runner_loss_redispatches_once_after_the_model_is_ready_again():
    ready = asyncio.Event()
    ready.set()
    attempts = 0

    async def execute(inputs, outputs):
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            ready.clear()  # what the model table does when the runner dies
            asyncio.get_running_loop().call_later(0.05, ready.set)
            raise RunnerLost("r")
        return {"y": inputs["x"]}, 0, ""

    loop = asyncio.get_running_loop()
    b = batcher(execute, ready=ready)
    request = make_request(loop)
    b.submit(request)
    assert (await request.future)["y"].shape == (1, 2)
    assert attempts == 2 and request.attempts == 1
    await b.close(Unavailable("done"), drain=False)


async def test_a_request_that_loses_its_runner_twice_fails_alone():
    async def execute(inputs, outputs):
        raise RunnerLost("r")

    loop = asyncio.get_running_loop()
    b = batcher(execute)
    request = make_request(loop)
    b.submit(request)
    with pytest.raises(InferenceFailed, match="crashed or hung"):
        await request.future
    await b.close(Unavailable("done"), drain=False)


async def test_a_poison_request_is_split_out_and_the_rest_are_served():
    runs: list[int] = []

    async def execute(inputs, outputs):
        x = inputs["x"]
        runs.append(len(x))
        if (x > 100).any():  # the poison: the runner would crash or hang on it
            raise RunnerLost("r")
        return {"y": x * 2}, 0, ""

    loop = asyncio.get_running_loop()
    b = batcher(execute, max_batch=8, delay_us=20_000)
    requests = [make_request(loop, value=1000.0 if i == 2 else float(i)) for i in range(6)]
    for request in requests:
        b.submit(request)
    results = await asyncio.gather(*(r.future for r in requests), return_exceptions=True)
    assert isinstance(results[2], InferenceFailed)
    for i, result in enumerate(results):
        if i != 2:
            assert not isinstance(result, Exception), result
            assert result["y"][0, 0] == 2 * i
    assert runs[0] == 6 and runs[1] == 6  # the whole batch, then once more
    assert len(runs) <= 2 + 2 * 3  # then halves: a few more runs, not one per request
    await b.close(Unavailable("done"), drain=False)


async def busy_batcher(
    loop: asyncio.AbstractEventLoop,
) -> tuple[Batcher, asyncio.Event, Request]:
    """A batcher with a queue of 2, its one instance busy on a request until `gate`
    is set."""
    gate = asyncio.Event()

    async def execute(inputs, outputs):
        await gate.wait()
        return {"y": inputs["x"]}, 0, ""

    b = batcher(execute, queue=2, max_batch=0)
    running = make_request(loop)
    b.submit(running)
    await asyncio.sleep(0)
    return b, gate, running


async def test_queue_bound_and_queued_deadlines():
    loop = asyncio.get_running_loop()
    b, gate, running = await busy_batcher(loop)
    short = make_request(loop, timeout=0.05)
    b.submit(short)
    b.submit(make_request(loop))
    with pytest.raises(QueueFull):
        b.submit(make_request(loop))
    with pytest.raises(Exception, match="timed out"):
        await short.future
    gate.set()
    await running.future
    await b.close(Unavailable("done"), drain=True)


async def test_a_priority_level_with_a_cap_of_its_own():
    """Triton's priority_queue_policy: level 2 may have one request waiting, level 1
    is held only by the model's queue size."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()

    async def execute(inputs, outputs):
        await gate.wait()
        return {"y": inputs["x"]}, 0, ""

    b = batcher(execute, queue=8, max_batch=0, level_caps={2: 1})
    b.submit(make_request(loop))  # runs, holding the one instance
    await asyncio.sleep(0)
    low = [make_request(loop) for _ in range(2)]
    for request in low:
        request.priority = 2
    b.submit(low[0])
    with pytest.raises(QueueFull, match="the queue of priority level 2 is full"):
        b.submit(low[1])
    for _ in range(3):
        high = make_request(loop)
        high.priority = 1
        b.submit(high)
    low[0].future.cancel()  # a cancelled one holds no place
    b.submit(low[1])
    gate.set()
    await b.close(Unavailable("done"), drain=True)


async def test_a_request_past_its_delay_goes_behind_its_level():
    """Triton's `timeout_action: DELAY`: a queued request past its model's timeout is
    not failed but served after every request of its level still within theirs,
    those that arrive later included; a higher level still goes first, and the
    request's own deadline still fails it."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    order: list[float] = []

    async def execute(inputs, outputs):
        await gate.wait()
        order.append(float(inputs["x"][0, 0]))
        return {"y": inputs["x"]}, 0, ""

    b = batcher(execute, queue=8, max_batch=0)
    b.submit(make_request(loop, value=0))  # runs, holding the one instance
    await asyncio.sleep(0)
    late = make_request(loop, value=1)
    late.delay_at = loop.time() + 0.05
    gone = make_request(loop, value=9, timeout=0.1)
    gone.delay_at = loop.time() + 0.05
    b.submit(late)
    b.submit(gone)
    b.submit(make_request(loop, value=2))
    await asyncio.sleep(0.15)  # both delayed; `gone` past its deadline as well
    b.submit(make_request(loop, value=3))  # within its timeout: ahead of the delayed
    high = make_request(loop, value=4)
    high.priority, high.delay_at = -1, loop.time()  # a higher level, delayed at once
    b.submit(high)
    gate.set()
    await late.future
    with pytest.raises(Exception, match="timed out"):
        await gone.future
    assert order == [0, 4, 2, 3, 1]
    await b.close(Unavailable("done"), drain=True)


async def test_cancelled_requests_hold_no_place_in_a_full_queue():
    loop = asyncio.get_running_loop()
    b, gate, running = await busy_batcher(loop)
    gone = [make_request(loop), make_request(loop)]
    for request in gone:
        b.submit(request)
        request.future.cancel()  # their callers went away
    waiting = make_request(loop)
    b.submit(waiting)  # the queue was full of abandoned requests only
    assert b.depth == 1
    gate.set()
    await running.future
    await waiting.future
    await b.close(Unavailable("done"), drain=True)


async def test_an_idle_model_hands_the_request_on_before_submit_returns():
    """The batch leaves within the loop iteration that admitted it: `execute` runs
    during `submit`, and only its result is awaited later. An error raised there
    reaches the request like one raised while awaiting."""
    loop = asyncio.get_running_loop()
    sent = []

    def execute(inputs, outputs):  # the synchronous half, as the runner dispatch does
        sent.append(inputs["x"].shape[0])

        async def result():
            return {"y": inputs["x"] + 1}, 1000, ""

        return result()

    b = batcher(execute, max_batch=0)
    request = make_request(loop)
    b.submit(request)
    assert sent == [1]  # written before submit returned
    out = await asyncio.wait_for(request.future, 5)
    assert out["y"].tolist() == [[2.0, 2.0]]

    def refuses(inputs, outputs):
        raise RunnerLost("r")  # the runner went away between admission and the write

    calls = 0

    def flaky(inputs, outputs):
        nonlocal calls
        calls += 1
        return refuses(inputs, outputs) if calls == 1 else execute(inputs, outputs)

    b = batcher(flaky, max_batch=0)
    request = make_request(loop)
    b.submit(request)
    out = await asyncio.wait_for(request.future, 5)  # re-dispatched once, answered
    assert calls == 2 and out["y"].tolist() == [[2.0, 2.0]]
