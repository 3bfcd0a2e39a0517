"""Every serving model's queue: its Batcher, and the event its batcher waits on while
the model is not ready (loading again, or its runner restarting).

Residency's effects open, pause and close queues as the owner decides; the core
queues every admitted request here (`submit`). Mechanism only: nothing here decides when a
model serves. Runs on the agent's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from edgeplex.agent.batching.batcher import Batcher
from edgeplex.agent.batching.dispatch import Served, make_batcher
from edgeplex.agent.batching.policy import Request
from edgeplex.agent.batching.rate_limiter import RateLimiter
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.observability.stats import ModelStats
from edgeplex.agent.observability.usage import Journal
from edgeplex.agent.oip.errors import ServeError, Unavailable
from edgeplex.agent.runners.supervisor import RunnerPool


class Queues:
    def __init__(
        self, pool: RunnerPool, usage: Journal | None = None, limiter: RateLimiter | None = None
    ) -> None:
        self._pool = pool
        self.usage = usage  # where batchers count the requests they answer
        self.limiter = limiter  # rate_limit: execution_count (rate_limiter.py)
        self._queues: dict[Hashable, Batcher] = {}
        self._ready: dict[Hashable, asyncio.Event] = {}
        self._made_from: dict[Hashable, object] = {}  # the source each queue was made for
        self._stats: dict[Hashable, ModelStats] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, key: Hashable) -> Batcher | None:
        return self._queues.get(key)

    def submit(self, key: Hashable, request: Request) -> None:
        """Queue an admitted request on its model's batcher (a lease always has one).
        Raises QueueFull, or the error the queue was closed with."""
        self._queues[key].submit(request)

    def stats(self, key: Hashable) -> ModelStats:
        """The OIP statistics of a model version (its key), kept across unloads."""
        return self._stats.setdefault(key, ModelStats())

    def pending(self, key: Hashable) -> int:
        """Requests of a model version queued and not yet executing."""
        queue = self._queues.get(key)
        return queue.depth if queue is not None else 0

    def open(self, model: Served, source: object, instances: int) -> None:
        """`model` serves: its queue (made anew if its source changed since the queue
        was made) takes batches, with `instances` workers."""
        key = model.key
        ready = self._ready.setdefault(key, asyncio.Event())
        queue = self._queues.get(key)
        if queue is not None and self._made_from.get(key) is not source:
            # Kept from before its last unload, but its config has changed since.
            self._close(queue, Unavailable(f"model '{model.name}' changed"), drain=True)
            queue = None
        if queue is None:
            self._queues[key] = make_batcher(
                model, self._pool, ready, self.stats(model.key), self.usage, self.limiter
            )
            self._made_from[key] = source
        else:  # a reload starts over at the configured instance count
            queue.set_instances(instances)
        METRICS.instances.labels(model=model.name).set(instances)
        METRICS.model_ready.labels(model=model.name).set(1)
        ready.set()

    def hold(self, key: Hashable, name: str) -> None:
        """Its batches wait (the model is not ready); the queue stays."""
        ready = self._ready.get(key)
        if ready is not None:
            ready.clear()
        METRICS.model_ready.labels(model=name).set(0)

    def set_instances(self, key: Hashable, name: str, instances: int) -> None:
        queue = self._queues.get(key)
        if queue is not None:
            queue.set_instances(instances)
            METRICS.instances.labels(model=name).set(instances)

    def close(self, key: Hashable, error: ServeError, drain: bool) -> None:
        """The queue goes: its requests get `error` (after the admitted ones are
        answered, with `drain`); closed in the background."""
        self._ready.pop(key, None)
        queue = self._queues.pop(key, None)
        if queue is not None:
            self._close(queue, error, drain)

    async def closed(self, key: Hashable, error: ServeError) -> None:
        """As close(drain=True), returning once its admitted requests are answered."""
        self._ready.pop(key, None)
        queue = self._queues.pop(key, None)
        if queue is not None:
            await queue.close(error, drain=True)

    def _close(self, queue: Batcher, error: ServeError, drain: bool) -> None:
        task = asyncio.create_task(queue.close(error, drain=drain))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def stop(self) -> None:
        for queue in self._queues.values():
            await queue.close(Unavailable("the agent is shutting down"), drain=False)
