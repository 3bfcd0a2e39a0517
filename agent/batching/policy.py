"""What a batch is, as pure functions over the queue: unit-tested without processes.

`take_batch` decides which queued requests run together; the batcher
(batcher.py) is the mechanism that applies it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

BatchKey = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(eq=False)
class Request:
    """One client request waiting for, or riding in, a batch."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None
    batch_size: int
    deadline: float  # loop.time()
    future: asyncio.Future[dict[str, np.ndarray]]
    key: BatchKey = ()  # set by the batcher it joins (batch_key)
    enqueued: float = field(default_factory=time.monotonic)
    attempts: int = 0
    # Non-zero while the request is a suspect in a batch that lost its runner
    # twice: it batches only with the same group, so halves are tried apart.
    group: int = 0
    form: str = ""  # the model's form that served it ("" as shipped)
    # Fair sharing between tenants (start-time fair queueing, batcher.py): whose
    # request it is, its share, and its virtual start and finish tags.
    tenant: str = ""
    weight: float = 1.0
    start: float = 0.0
    tag: float = 0.0
    cold_start: str = ""  # the tier its model was promoted from for it ("": loaded)


def batch_key(inputs: dict[str, np.ndarray], batching: bool) -> BatchKey:
    """Requests may share a batch only when every input agrees on all but dim 0."""
    return tuple(
        sorted((n, a.dtype.str, a.shape[1:] if batching else a.shape) for n, a in inputs.items())
    )


def take_batch(queue: deque[Request], max_batch_size: int) -> list[Request]:
    """Pop the next batch: the head plus later requests of the same key, in order,
    while their summed batch sizes fit max_batch_size (0: the head alone).
    Requests whose future is already done (cancelled by their caller) are dropped."""
    while queue and queue[0].future.done():
        queue.popleft()
    if not queue:
        return []
    head = queue.popleft()
    batch = [head]
    if max_batch_size <= 0:
        return batch
    size = head.batch_size
    kept: deque[Request] = deque()
    while queue and size < max_batch_size:
        request = queue.popleft()
        if request.future.done():
            continue
        same = request.key == head.key and request.group == head.group
        if same and size + request.batch_size <= max_batch_size:
            batch.append(request)
            size += request.batch_size
        else:
            kept.append(request)
    queue.extendleft(reversed(kept))
    return batch


def batched_size(queue: deque[Request], key: BatchKey) -> int:
    return sum(r.batch_size for r in queue if r.key == key and not r.future.done())
