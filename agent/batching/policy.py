"""What a batch is, as pure functions over the queue: unit-tested without processes.

`take_batch` decides which queued requests run together; the batcher
(batcher.py) is the mechanism that applies it.
"""

from __future__ import annotations

import asyncio
import itertools
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
    if max_batch_size <= 0:
        return [queue.popleft()]
    batch, scanned = _candidates(queue, max_batch_size)
    if preferred:
        batch = batch[: preferred_cut([r.batch_size for r in batch], preferred)]
    taken = {id(r) for r in batch}
    looked = (queue.popleft() for _ in range(scanned))
    kept = [r for r in looked if id(r) not in taken and not r.future.done()]
    queue.extendleft(reversed(kept))
    return batch


def _candidates(queue: deque[Request], max_batch_size: int) -> tuple[list[Request], int]:
    """The next batch's requests: the head, then each later live request of its key
    that still fits max_batch_size, until the batch is full; and how many of the
    queue's requests were looked at for it."""
    head = queue[0]
    batch, size, scanned = [head], head.batch_size, 1
    for request in itertools.islice(queue, 1, None):
        if size >= max_batch_size:
            break
        scanned += 1
        if request.future.done() or request.key != head.key or request.group != head.group:
            continue
        if size + request.batch_size <= max_batch_size:
            batch.append(request)
            size += request.batch_size
    return batch, scanned


def preferred_cut(sizes: list[int], preferred: tuple[int, ...]) -> int:
    """How many of a batch's requests (their batch sizes, in order) to send, as
    Triton's dynamic batcher cuts a batch to its preferred sizes: the longest run
    from the first whose total is a preferred size; else, where the next request
    would carry the total past the largest preferred size, the run before it; else
    all of them (a batch that fills no preferred size goes as it is)."""
    largest = max(preferred)
    total, best = 0, 0
    for n, size in enumerate(sizes):
        if n and total + size > largest and not best:
            best = n
        total += size
        if total in preferred:
            best = n + 1
    return best or len(sizes)


def batch_ready(queue: deque[Request], max_batch_size: int, preferred: tuple[int, ...]) -> bool:
    """Whether the batch at the head of the queue may go before its delay is out:
    it is full (max_batch_size, or the largest preferred size), or it fills a
    preferred size (Triton sends a preferred batch as soon as it can form one)."""
    sizes = [r.batch_size for r in _candidates(queue, max_batch_size)[0]]
    if sum(sizes) >= (max(preferred) if preferred else max_batch_size):
        return True
    total = 0
    for size in sizes:
        total += size
        if total in preferred:
            return True
    return False
