"""Per-model request queue and dynamic batcher.

The policy is policy.py (which requests run together). `Batcher` is the
mechanism: one asyncio task per model that waits for requests, a free
instance and (optionally) more requests, then hands a batch to the model's
`execute` callable and splits the result. An idle model skips the task: the
request that finds it idle is handed to `execute` at once.

Guarantees:
- requests whose non-batch dimensions or datatypes differ never share a batch
  (they have different `key`s);
- when a batch fails, every member gets the same error;
- a batch lost with its runner (it crashed, or hung past the execution
  timeout and was killed) is re-dispatched once, at the head of the queue;
  lost again, it is split in halves that run apart from other requests, until
  the request at fault is alone: it alone fails (INTERNAL, naming the model),
  the others are answered;
- requests past their deadline are failed with DEADLINE_EXCEEDED, queued or not;
- the queue is bounded: `submit` raises QueueFull beyond max_queue_size, or beyond
  its priority level's own cap (level_caps: Triton's priority_queue_policy);
- with a rate limiter `gate` (rate_limiter.py), a batch starts only once it holds
  the model's resources, and gives them back when it is answered; a grant the
  batcher cannot use (its queue emptied, the model stopped serving) goes back.

All methods run on the agent's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from edgeplex.agent.batching.policy import Request, batch_key, batch_ready, take_batch
from edgeplex.agent.batching.rate_limiter import Gate
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.observability.stats import ModelStats
from edgeplex.agent.oip.errors import (
    DeadlineExceeded,
    InferenceFailed,
    QueueFull,
    RunnerLost,
    ServeError,
)

# The result of a batch: (outputs, compute_ns, the form that ran them).
BatchResult = tuple[dict[str, np.ndarray], int, str]
# execute(inputs, output_names): called when the batch starts; what it returns is
# awaited, then given to `read` for the batch's result (or its error).
Execute = Callable[[dict[str, np.ndarray], list[str] | None], Awaitable[Any]]
Read = Callable[["asyncio.Future[Any]"], BatchResult]
# count(served, batch length, rows, input bytes, outputs, compute_ns): the requests a
# batch answered, counted for their tenants' usage (observability/usage.py) before
# any answer leaves.
Count = Callable[[list[Request], int, int, int, dict[str, np.ndarray], int], None]


class Batcher:
    def __init__(
        self,
        model: str,
        *,
        max_batch_size: int,
        max_queue_delay_us: int,
        max_queue_size: int,
        level_caps: dict[int, int] | None = None,
        preferred_batch_sizes: tuple[int, ...] = (),
        instance_count: int,
        execute: Execute,
        ready: asyncio.Event,
        read: Read | None = None,
        stats: ModelStats,
        count: Count | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_us / 1e6
        self.preferred_batch_sizes = preferred_batch_sizes
        self.max_queue_size = max_queue_size
        self.level_caps = level_caps or {}  # priority level: its own cap on waiting
        self._execute = execute
        self._read: Read = read or _result
        self._ready = ready  # set by the model table while the model can serve
        self._stats = stats
        self._count = count
        self._queue: deque[Request] = deque()  # in virtual finish order (_enqueue)
        self._virtual = 0.0  # fair queueing's virtual time
        self._finish: dict[str, float] = {}  # each tenant's last finish tag queued
        self._arrived = Wakeup()
        self.instances = instance_count
        self._free_slots = instance_count  # batches that may start now
        self.last_queued = time.monotonic()  # when the queue was last non-empty
        self._running = 0  # requests in batches that have started
        self._slot_freed = Wakeup()
        self._inflight: set[asyncio.Future[Any]] = set()  # batches sent, not answered
        self._closed: ServeError | None = None
        self._suspects = 0  # group ids of split batches
        self._gate = gate
        self._granted = Wakeup()
        if gate is not None:
            gate.on_grant = self._granted.set
            gate.on_wait = METRICS.rate_limited.labels(model=model).inc
        self._task = asyncio.create_task(self._run(), name=f"batcher-{model}")
        self._depth = METRICS.queue_depth.labels(model=model)

    @property
    def depth(self) -> int:
        return len(self._queue)

    def _waiting_at(self, level: int) -> int:
        """Requests of priority `level` queued (a count over the queue: only for a
        level with a cap of its own, bounded by max_queue_size)."""
        return sum(1 for queued in self._queue if queued.priority == level)

    @property
    def load(self) -> int:
        """Requests queued or running: what a demotion would have to drain."""
        return len(self._queue) + self._running

    def submit(self, request: Request) -> None:
        if self._closed is not None:
            raise self._closed
        request.key = batch_key(request.inputs, self.max_batch_size > 0)
        if len(self._queue) >= self.max_queue_size:
            self._drop_abandoned()
        if len(self._queue) >= self.max_queue_size:
            raise QueueFull(
                f"model '{self.model}': queue is full ({self.max_queue_size} requests waiting)"
            )
        cap = self.level_caps.get(request.priority)
        if cap is not None and self._waiting_at(request.priority) >= cap:
            self._drop_abandoned()
            if self._waiting_at(request.priority) >= cap:
                raise QueueFull(
                    f"model '{self.model}': the queue of priority level {request.priority} is "
                    f"full ({cap} requests waiting)"
                )
        if (
            not self._queue
            and self._free_slots > 0
            and self._ready.is_set()
            and not (self.max_queue_delay_s and self.max_batch_size)
            and (self._gate is None or self._gate.take_now())
        ):
            # Fast path: an idle model starts the request now, skipping one loop hop.
            self._start([request])
            return
        self._enqueue(request)
        self.last_queued = time.monotonic()
        self._depth.set(len(self._queue))
        self._arrived.set()

    def _drop_abandoned(self) -> None:
        """Requests whose callers went away (their futures cancelled, or timed out)
        hold no place in a full queue: a burst of cancelled calls must not refuse the
        next caller."""
        self._queue = deque(r for r in self._queue if not r.future.done())
        self._depth.set(len(self._queue))

    def _enqueue(self, request: Request) -> None:
        """Queue `request` in order of its virtual finish tag (start-time fair
        queueing): each tenant's requests follow one another 1/weight apart from
        when the tenant last had one queued, or from now (the virtual time: the
        start tag of the request served last) if it had none. Backlogged tenants
        are served in proportion to their weights, a tenant arriving into a deep
        backlog starts near its head, and one tenant's requests keep their order.
        With one tenant every tag is the largest yet: a plain append. Above all that,
        a request goes behind every queued one of its priority level or a higher one
        (a lower number) and ahead of every one of a lower level."""
        queue = self._queue
        if not queue:
            self._virtual = 0.0  # nobody waits: no one keeps credit or debt
            self._finish.clear()
        start = max(self._virtual, self._finish.get(request.tenant, 0.0))
        request.start, request.tag = start, start + 1.0 / request.weight
        self._finish[request.tenant] = request.tag
        if not queue or not _after(queue[-1], request):
            queue.append(request)
            return
        at = len(queue) - 1
        while at > 0 and _after(queue[at - 1], request):
            at -= 1
        queue.insert(at, request)

    async def close(self, error: ServeError, drain: bool) -> None:
        """Stop accepting requests. drain=True lets queued and running batches finish;
        else queued requests fail with `error`. Running batches always finish."""
        self._closed = error
        if drain:
            while self._queue:
                self._arrived.set()
                await asyncio.sleep(0.005)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._gate is not None:
            self._gate.withdraw()
        for request in self._queue:
            _fail(request, error)
        self._queue.clear()
        self._depth.set(0)
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    def set_instances(self, instances: int) -> None:
        """The runner now runs `instances` workers: allow that many batches at once.
        Fewer: running batches finish; new ones start only under the new count."""
        self._free_slots += instances - self.instances
        self.instances = instances
        if self._free_slots > 0:
            self._slot_freed.set()

    def fail_queued(self, error: ServeError) -> None:
        for request in self._queue:
            _fail(request, error)
        self._queue.clear()
        self._depth.set(0)

    # --- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._expire(loop.time())
            gate = self._gate
            if not self._queue:
                if gate is not None:
                    gate.withdraw()
                self._arrived.clear()
                await self._arrived.wait(loop)
                continue
            if gate is not None and (self._free_slots <= 0 or not self._ready.is_set()):
                gate.withdraw()  # resources are no use to a batch that cannot start
            if not await self._ready_or_expire(loop):
                continue
            if self._free_slots <= 0:
                await self._wait_for_slot(loop)
                continue  # re-check deadlines, readiness and the queue
            if not self._ready.is_set():
                continue  # the runner died while we waited for a slot: wait for the reload
            # Holding a grant, the batch goes with what is queued: no resources held idle.
            waited_out = gate is not None and gate.pending
            if self.max_queue_delay_s and self.max_batch_size and not waited_out:
                waited_out = await self._gather_more(loop)
            if gate is not None and not gate.ask():
                await self._wait_for_resources(loop)
                continue  # re-check deadlines, readiness and the queue
            # Past its delay a batch takes what is queued; before it, a preferred size.
            preferred = () if waited_out else self.preferred_batch_sizes
            batch = take_batch(self._queue, self.max_batch_size, preferred)
            self._depth.set(len(self._queue))
            if batch:
                self._virtual = max(self._virtual, batch[0].start)
                self._start(batch)

    def _start(self, batch: list[Request]) -> None:
        """Hand the batch to `execute` now (an idle runner starts on it within this
        loop iteration); its result is taken by a callback (no task per batch when
        `execute` returns a future, as the runner dispatch does)."""
        self._free_slots -= 1
        self._running += len(batch)
        if self._gate is not None:
            self._gate.started()
        started = time.monotonic()
        if len(batch) == 1:
            inputs = batch[0].inputs
        else:
            inputs = {n: np.concatenate([r.inputs[n] for r in batch]) for n in batch[0].inputs}
        wanted = _union_outputs(batch)
        bytes_in = sum(a.nbytes for a in inputs.values()) if self._count else 0
        assembled = time.monotonic()
        try:
            outcome = self._execute(inputs, wanted)
            result = (
                outcome if isinstance(outcome, asyncio.Future) else asyncio.ensure_future(outcome)
            )
        except Exception as exc:  # raised before the batch left: handled as if after
            result = asyncio.get_running_loop().create_future()
            result.set_exception(exc)
        self._inflight.add(result)
        result.add_done_callback(
            functools.partial(self._finished, batch, started, assembled, bytes_in)
        )

    async def _ready_or_expire(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait for the model to serve, at most until the earliest queued deadline."""
        if self._ready.is_set():
            return True
        earliest = min(r.deadline for r in self._queue)
        try:
            await asyncio.wait_for(self._ready.wait(), max(0.0, earliest - loop.time()))
            return True
        except TimeoutError:
            self._expire(loop.time())
            return False

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a running batch to finish, at most until the earliest deadline."""
        self._slot_freed.clear()
        earliest = min((r.deadline for r in self._queue), default=loop.time() + 1.0)
        await self._slot_freed.wait(loop, earliest)

    async def _wait_for_resources(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the rate limiter's grant, at most until the earliest deadline."""
        self._granted.clear()
        earliest = min((r.deadline for r in self._queue), default=loop.time() + 1.0)
        await self._granted.wait(loop, earliest)

    async def _gather_more(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Hold the head's batch until it may go (policy.batch_ready) or the head has
        waited max_queue_delay_us; True when the delay ran out."""
        head = self._queue[0]
        until = loop.time() + self.max_queue_delay_s - (time.monotonic() - head.enqueued)
        while not batch_ready(self._queue, self.max_batch_size, self.preferred_batch_sizes):
            if until - loop.time() <= 0:
                return True
            self._arrived.clear()
            await self._arrived.wait(loop, until)
        return False

    def _expire(self, now: float) -> None:
        """Fail the queued requests past their deadline, and move those past their
        delay (timeout_action: delay) behind every request of their level that is not
        delayed, in the order they were."""
        if not any(r.deadline <= now or r.delay_at <= now for r in self._queue):
            return
        keep: deque[Request] = deque()
        moved = False
        for request in self._queue:
            if request.deadline <= now:
                _fail(
                    request,
                    DeadlineExceeded(
                        f"model '{self.model}': request timed out after waiting in the queue"
                    ),
                )
                continue
            if request.delay_at <= now:
                request.delay_at, request.delayed, moved = math.inf, True, True
            keep.append(request)
        if moved:  # a stable sort: each level's order kept, its delayed ones last
            keep = deque(sorted(keep, key=lambda r: (r.priority, r.delayed)))
        self._queue = keep
        self._depth.set(len(keep))

    def _finished(
        self,
        batch: list[Request],
        started: float,
        assembled: float,
        bytes_in: int,
        result: asyncio.Future[Any],
    ) -> None:
        """A batch's result is in (or its error): answer its requests, free its slot."""
        self._inflight.discard(result)
        try:
            if not result.cancelled():
                self._answer(batch, result, started, assembled, bytes_in)
        finally:
            self._free_slots += 1
            self._running -= len(batch)
            if self._gate is not None:
                self._gate.done()
            self._slot_freed.set()

    def _answer(
        self,
        batch: list[Request],
        result: asyncio.Future[Any],
        started: float,
        assembled: float,
        bytes_in: int,
    ) -> None:
        batching = self.max_batch_size > 0
        try:
            outputs, compute_ns, form = self._read(result)
        except RunnerLost:
            self._redispatch_or_fail(batch)
            return
        except ServeError as exc:
            for request in batch:
                _fail(request, exc)
            return
        except Exception as exc:  # a bug must not leave clients hanging
            error = InferenceFailed(f"model '{self.model}': {type(exc).__name__}: {exc}")
            for request in batch:
                _fail(request, error)
            return
        finished = time.monotonic()
        offset = 0
        served = []
        for request in batch:
            if batching:
                mine = {n: a[offset : offset + request.batch_size] for n, a in outputs.items()}
                offset += request.batch_size
            else:
                mine = outputs
            if request.outputs is not None:
                mine = {n: mine[n] for n in request.outputs}
            if not request.future.done():
                request.form = form
                request.future.set_result(mine)
                served.append(request)
        if self._count is not None and served:
            self._count(served, len(batch), offset, bytes_in, outputs, compute_ns)
        self._stats.record_batch(batch, started, assembled, compute_ns, time.monotonic(), finished)
        series = METRICS.of_model(self.model)
        series.batch_size.observe(len(batch))
        series.compute_duration.observe(compute_ns / 1e9)
        queue_hist = series.queue_duration
        for request in batch:
            queue_hist.observe(started - request.enqueued)

    def _redispatch_or_fail(self, batch: list[Request]) -> None:
        """Lost once: run the batch again. Lost again: split it, so the request that
        crashes or hangs the runner ends up alone and fails alone."""
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        if all(r.attempts == 0 for r in live):
            groups = [live]
        elif len(live) == 1:
            _fail(
                live[0],
                InferenceFailed(
                    f"model '{self.model}': this request crashed or hung the model's runner "
                    "twice; the other requests were served"
                ),
            )
            return
        else:
            half = len(live) // 2
            groups = [live[:half], live[half:]]
        for group in reversed(groups):
            self._suspects += 1
            for request in reversed(group):
                request.attempts += 1
                request.group = self._suspects if len(groups) > 1 or request.group else 0
                self._queue.appendleft(request)
        self._depth.set(len(self._queue))
        self._arrived.set()


def _after(queued: Request, request: Request) -> bool:
    """Whether `queued` is to be served after `request`: a lower priority level; or
    the same level, and delayed where `request` is not; or else a later virtual
    finish tag."""
    if queued.priority != request.priority:
        return queued.priority > request.priority
    if queued.delayed != request.delayed:
        return queued.delayed
    return queued.tag > request.tag


def _union_outputs(batch: list[Request]) -> list[str] | None:
    if any(r.outputs is None for r in batch):
        return None
    names: dict[str, None] = {}
    for request in batch:
        names.update(dict.fromkeys(request.outputs or ()))
    return list(names)


def _result(done: asyncio.Future[Any]) -> BatchResult:
    """What an `execute` without its own `read` returned: the batch's result."""
    return done.result()  # type: ignore[no-any-return]


def _fail(request: Request, error: Any) -> None:
    if not request.future.done():
        request.future.set_exception(error)


class Wakeup:
    """The batcher loop's wake-up: `set` wakes its one waiter, or `wait` returns at
    `until` (loop time). An asyncio.Event with wait_for would make a task per wait."""

    __slots__ = ("_is_set", "_waiter")

    def __init__(self) -> None:
        self._is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._is_set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    async def wait(self, loop: asyncio.AbstractEventLoop, until: float | None = None) -> None:
        if self._is_set:
            return
        waiter = self._waiter = loop.create_future()
        timer = None if until is None else loop.call_at(until, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
