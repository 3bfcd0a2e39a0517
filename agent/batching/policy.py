"""What a batch is, as pure functions over the queue: unit-tested without processes.

`take_batch` decides which queued requests run together; the batcher
(batcher.py) is the mechanism that applies it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
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
    priority: int = 0  # its level in the queue: lower goes first (ModelConfig.priority_level)
    # When, still queued, it goes behind every request of its level not delayed
    # (timeout_action: delay); inf: never. `delayed` once it has.
    delay_at: float = math.inf
    delayed: bool = False


def batch_key(inputs: dict[str, np.ndarray], batching: bool) -> BatchKey:
    """Requests may share a batch only when every input agrees on all but dim 0."""
    return tuple(
        sorted((n, a.dtype.str, a.shape[1:] if batching else a.shape) for n, a in inputs.items())
    )


def take_batch(
    queue: deque[Request], max_batch_size: int, preferred: tuple[int, ...] = ()
) -> list[Request]:
    """Pop the next batch: the head plus later requests of the same key, in order,
    while their summed batch sizes fit max_batch_size (0: the head alone), cut back
    to `preferred_cut` of them when `preferred` sizes are given. Requests whose
    future is already done (cancelled by their caller) are dropped."""
    while queue and queue[0].future.done():
        queue.popleft()
    if not queue:
        return []
    count = len(queue)  # no preferred sizes: as many as fit
    if preferred and max_batch_size > 0:  # a look ahead only for models that prefer sizes
        count = preferred_cut([r.batch_size for r in _candidates(queue, max_batch_size)],
                              preferred)  # fmt: skip
    head = queue.popleft()
    batch = [head]
    if max_batch_size <= 0:
        return batch
    size = head.batch_size
    kept: deque[Request] = deque()
    while queue and size < max_batch_size and len(batch) < count:
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


def _candidates(queue: deque[Request], max_batch_size: int) -> list[Request]:
    """The requests take_batch would take, without taking them: the head, then each
    later live request of its key that still fits max_batch_size."""
    head = queue[0]
    batch, size = [head], head.batch_size
    for request in itertools.islice(queue, 1, None):
        if size >= max_batch_size:
            break
        if request.future.done() or request.key != head.key or request.group != head.group:
            continue
        if size + request.batch_size <= max_batch_size:
            batch.append(request)
            size += request.batch_size
    return batch


def preferred_cut(sizes: list[int], preferred: tuple[int, ...]) -> int:
    """How many of a batch's requests (their batch sizes, in order) to send, as
    Triton's dynamic batcher cuts a batch to its preferred sizes: the longest run
    from the first whose total is a preferred size; else, where the next request
    would carry the total past the largest preferred size, the run before it; else
    all of them (a batch that fills no preferred size goes as it is)."""
    totals = list(itertools.accumulate(sizes))
    filled = [n + 1 for n, total in enumerate(totals) if total in preferred]
    if filled:
        return filled[-1]
    largest = max(preferred)
    return next((n for n, total in enumerate(totals) if n and total > largest), len(sizes))


def batch_ready(queue: deque[Request], max_batch_size: int, preferred: tuple[int, ...]) -> bool:
    """Whether the batch at the head of the queue may go before its delay is out:
    it is full (max_batch_size, or the largest preferred size), or it fills a
    preferred size (Triton sends a preferred batch as soon as it can form one)."""
    totals = list(itertools.accumulate(r.batch_size for r in _candidates(queue, max_batch_size)))
    full = max(preferred) if preferred else max_batch_size
    return totals[-1] >= full or any(total in preferred for total in totals)
