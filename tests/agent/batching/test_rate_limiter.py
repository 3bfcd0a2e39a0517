"""Triton's rate limiter: the pool's counts, turns by priority, a line kept in order,
and batchers of two models that share one resource never running at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edgeplex.agent.batching.batcher import Batcher
from edgeplex.agent.batching.policy import Request, batch_key
from edgeplex.agent.batching.rate_limiter import Gate, RateLimiter
from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.observability.stats import ModelStats
from edgeplex.agent.oip.errors import Unavailable


def test_a_resource_not_counted_holds_the_most_any_model_asks_for():
    limiter = RateLimiter({"named": 2})
    limiter.gate({"r": 4, "named": 1}, 1)
    limiter.gate({"r": 5}, 1)
    limiter.gate({"r": 3}, 1)
    assert limiter.counts == {"named": 2, "r": 5}
    assert limiter.free == {"named": 2, "r": 5}
    assert limiter.shortfall({"named": 2, "r": 50}) == ""
    assert limiter.shortfall({"named": 3}) == (
        "its rate limiter asks for 3 of resource 'named', and the agent has 2 "
        "(rate_limit_resources)"
    )


def _turns(limiter: RateLimiter, gates: dict[str, Gate], grants: int) -> list[str]:
    """Every model always has a batch waiting: while one of its batches runs, its next
    one waits in line (models of two instances), so each grant chooses among all."""
    order: list[str] = []
    for name, gate in gates.items():
        gate.on_grant = lambda name=name: order.append(name)
        if gate.ask():
            order.append(name)
    while len(order) < grants:
        gate = gates[order[-1]]
        gate.started()
        assert not gate.ask()  # its next batch, in line behind the running one
        gate.done()  # the lowest pass in line is granted here
    return order[:grants]


def test_waiting_models_take_turns_by_priority():
    limiter = RateLimiter({"r": 1})
    gates = {"one": limiter.gate({"r": 1}, 1), "two": limiter.gate({"r": 1}, 2)}
    order = _turns(limiter, gates, 30)
    assert 19 <= order.count("one") <= 21, order  # 2:1, give or take the first turn
    equal = RateLimiter({"r": 1})
    order = _turns(equal, {"a": equal.gate({"r": 1}, 1), "b": equal.gate({"r": 1}, 1)}, 20)
    assert order == ["a", "b"] * 10


def test_a_model_asking_for_much_is_not_starved_by_ones_asking_for_little():
    limiter = RateLimiter({"r": 2})
    small_a, small_b, big = (limiter.gate({"r": n}, 1) for n in (1, 1, 2))
    assert small_a.ask() and small_b.ask()
    small_a.started()
    small_b.started()
    granted: list[str] = []
    big.on_grant = lambda: granted.append("big")
    assert not big.ask()  # in line: both units are held
    small_a.done()  # one unit back: not enough for big
    assert granted == [] and limiter.free == {"r": 1}
    assert not small_a.take_now() and not small_a.ask()  # behind big, though a unit is free
    small_b.done()
    assert granted == ["big"] and big.pending
    big.started()
    big.done()  # then small_a's turn
    assert small_a.pending


def test_a_grant_not_used_goes_back_to_the_next_in_line():
    limiter = RateLimiter({"r": 1})
    first, second = limiter.gate({"r": 1}, 1), limiter.gate({"r": 1}, 1)
    told: list[str] = []
    second.on_grant = lambda: told.append("second")
    assert first.ask() and not second.ask()
    first.withdraw()  # its queue emptied before the batch started
    assert told == ["second"] and second.pending and not first.pending
    second.withdraw()
    assert limiter.free == {"r": 1} and limiter.waiting == 0


def test_a_model_config_names_resources_as_triton_does():
    with pytest.raises(ValueError, match="count 0 is below 1"):
        ModelConfig(rate_limit_resources={"r": 0})
    with pytest.raises(ValueError, match="1 to 64 printable characters"):
        ModelConfig(rate_limit_resources={"": 1})


def make_request(loop: asyncio.AbstractEventLoop, timeout: float) -> Request:
    inputs = {"x": np.ones((1, 2), np.float32)}
    return Request(
        inputs=inputs,
        outputs=None,
        batch_size=1,
        key=batch_key(inputs, True),
        deadline=loop.time() + timeout,
        future=loop.create_future(),
    )


def _batcher(name: str, execute, limiter: RateLimiter, priority: int = 1) -> Batcher:
    ready = asyncio.Event()
    ready.set()
    return Batcher(
        name,
        max_batch_size=8,
        max_queue_delay_us=0,
        max_queue_size=64,
        instance_count=2,  # two instances each: only the resource keeps them apart
        execute=execute,
        ready=ready,
        stats=ModelStats(),
        gate=limiter.gate({"r": 1}, priority),
    )


async def test_two_models_sharing_one_resource_never_run_at_once():
    loop = asyncio.get_running_loop()
    limiter = RateLimiter({"r": 1})
    running: list[str] = []
    most = 0
    ran: list[str] = []

    def executor(name: str):
        async def execute(inputs, outputs):
            nonlocal most
            running.append(name)
            most = max(most, len(running))
            ran.append(name)
            await asyncio.sleep(0.002)
            running.remove(name)
            return {"y": inputs["x"] + 1}, 1000, ""

        return execute

    a = _batcher("a", executor("a"), limiter)
    b = _batcher("b", executor("b"), limiter)
    requests = []
    for _ in range(6):
        for model in (a, b):
            request = make_request(loop, timeout=10.0)
            model.submit(request)
            requests.append(request)
            await asyncio.sleep(0)
    results = await asyncio.gather(*(r.future for r in requests))
    assert all(float(result["y"][0, 0]) == 2.0 for result in results)
    assert most == 1, ran  # one batch at a time over both models
    assert set(ran) == {"a", "b"}
    assert limiter.free == {"r": 1} and limiter.waiting == 0
    for model in (a, b):
        await model.close(Unavailable("done"), drain=True)


async def test_a_request_waiting_for_resources_still_ends_at_its_deadline():
    loop = asyncio.get_running_loop()
    limiter = RateLimiter({"r": 1})
    hold = asyncio.Event()

    async def slow(inputs, outputs):
        await hold.wait()
        return {"y": inputs["x"]}, 1000, ""

    a = _batcher("a", slow, limiter)
    b = _batcher("b", slow, limiter)
    a.submit(make_request(loop, timeout=5.0))
    await asyncio.sleep(0)
    late = make_request(loop, timeout=0.05)
    b.submit(late)
    with pytest.raises(Exception, match="timed out"):
        await late.future
    hold.set()
    await asyncio.sleep(0.01)
    assert limiter.free == {"r": 1} and limiter.waiting == 0  # b left the line
    for model in (a, b):
        await model.close(Unavailable("done"), drain=True)


def test_resources_held_while_nothing_runs_are_none():
    # Bookkeeping only: asking, starting and finishing leave the pool as it was.
    limiter = RateLimiter()
    gate = limiter.gate({"r": 3}, 1)
    for _ in range(3):
        assert gate.ask()
        gate.started()
        gate.done()
    assert limiter.free == {"r": 3} and np.isclose(gate.pass_, 3.0)
