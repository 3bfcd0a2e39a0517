"""The batching policy (take_batch) as a pure function: no loop, no processes."""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from edgeplex.agent.batching.policy import Request, batch_key, take_batch


class _Future:
    """Stands in for asyncio.Future: take_batch only asks done()."""

    def __init__(self, done: bool = False) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


def req(rows: int, width: int = 4, dtype=np.float32, done: bool = False) -> Request:
    inputs = {"x": np.zeros((rows, width), dtype)}
    return Request(
        inputs=inputs,
        outputs=None,
        batch_size=rows,
        key=batch_key(inputs, True),
        deadline=0.0,
        future=_Future(done),
    )  # type: ignore[arg-type]


def test_head_and_compatible_requests_fill_the_batch_in_order():
    a, b, c = req(2), req(3), req(4)
    queue = deque([a, b, c])
    assert take_batch(queue, 5) == [a, b]
    assert list(queue) == [c]


def test_other_shapes_or_dtypes_never_share_a_batch_and_keep_their_place():
    a, wide, b, ints = req(1), req(1, width=8), req(1), req(1, dtype=np.int64)
    queue = deque([a, wide, b, ints])
    assert take_batch(queue, 8) == [a, b]
    assert list(queue) == [wide, ints]


def test_no_batching_takes_the_head_alone():
    queue = deque([req(1), req(1)])
    assert len(take_batch(queue, 0)) == 1 and len(queue) == 1


def test_cancelled_requests_are_dropped():
    live = req(1)
    queue = deque([req(1, done=True), live, req(1, done=True)])
    assert take_batch(queue, 8) == [live]
    assert not queue


def test_non_batching_key_includes_the_full_shape():
    a = {"x": np.zeros((1, 4), np.float32)}
    b = {"x": np.zeros((2, 4), np.float32)}
    assert batch_key(a, True) == batch_key(b, True)
    assert batch_key(a, False) != batch_key(b, False)


@given(
    st.lists(st.tuples(st.integers(1, 4), st.sampled_from([4, 8])), max_size=30), st.integers(0, 8)
)
def test_batches_respect_the_limit_and_lose_nothing(specs, max_batch):
    queue = deque(req(rows, width) for rows, width in specs)
    original = list(queue)
    seen = []
    while queue:
        batch = take_batch(queue, max_batch)
        assert batch
        assert len({r.key for r in batch}) == 1
        if max_batch:
            assert sum(r.batch_size for r in batch) <= max(max_batch, batch[0].batch_size)
        else:
            assert len(batch) == 1
        seen += batch
    assert sorted(map(id, seen)) == sorted(map(id, original))


def test_request_future_type_is_asyncio():
    # Requests made by the agent carry real asyncio futures; the fake above only
    # mirrors the one method the policy uses.
    assert hasattr(asyncio.Future, "done")
