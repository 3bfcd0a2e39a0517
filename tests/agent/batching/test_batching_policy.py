"""The batching policy (take_batch, preferred sizes) as pure functions: no loop, no
processes."""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeplex.agent.batching.policy import (
    Request,
    batch_key,
    batch_ready,
    preferred_cut,
    take_batch,
)


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


@pytest.mark.parametrize(
    ("sizes", "preferred", "cut"),
    [
        ([1] * 6, (4, 8), 4),  # the largest preferred size the queue fills
        ([1] * 8, (4, 8), 8),
        ([1] * 3, (4, 8), 3),  # fills none: all of it (the delay is out, or none is set)
        ([2, 2, 3], (4, 8), 2),
        ([1, 2, 3, 1], (4,), 2),  # 1+2 = 3, then 3 more passes 4: the two before it
        ([16], (4, 8), 1),  # a first request larger than every preferred size goes alone
        ([3, 1, 1], (2,), 1),
    ],
)
def test_preferred_cut_as_tritons_dynamic_batcher(sizes, preferred, cut):
    assert preferred_cut(sizes, preferred) == cut


def test_a_preferred_cut_leaves_the_rest_at_the_front_in_order():
    requests = [req(1) for _ in range(6)]
    other = req(1, width=8)
    queue = deque([*requests[:3], other, *requests[3:]])
    assert take_batch(queue, 8, (4,)) == requests[:4]
    assert list(queue) == [other, *requests[4:]]


def test_a_batch_is_ready_before_its_delay_when_full_or_at_a_preferred_size():
    queue = deque(req(1) for _ in range(3))
    assert not batch_ready(queue, 8, ())
    assert not batch_ready(queue, 8, (4, 8))
    assert batch_ready(queue, 8, (2, 8))  # 2 of the 3 make a preferred batch
    queue.append(req(1))
    assert batch_ready(queue, 8, (4, 8))
    assert not batch_ready(queue, 8, ())  # without preferred sizes: full at 8 only
    queue.extend(req(1) for _ in range(4))
    assert batch_ready(queue, 8, ())
    assert batch_ready(deque([req(5)]), 8, (4,))  # already past the largest


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=20),
    st.sets(st.integers(1, 8), min_size=1, max_size=3),
)
def test_preferred_batches_respect_the_limit_and_lose_nothing(rows, preferred):
    queue = deque(req(n) for n in rows)
    original = list(queue)
    seen = []
    while queue:
        batch = take_batch(queue, 8, tuple(sorted(preferred)))
        assert batch and sum(r.batch_size for r in batch) <= max(8, batch[0].batch_size)
        seen += batch
    assert sorted(map(id, seen)) == sorted(map(id, original))


def test_request_future_type_is_asyncio():
    # Requests made by the agent carry real asyncio futures; the fake above only
    # mirrors the one method the policy uses.
    assert hasattr(asyncio.Future, "done")
