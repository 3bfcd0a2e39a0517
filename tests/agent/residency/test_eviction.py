"""Eviction policies as pure functions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgeplex.eviction import (
    Candidate,
    GreedyDualSizeFrequency,
    IdleTimeToLive,
    LeastRecentlyUsedByCount,
    NoOverCommit,
)

MB = 1 << 20


def c(name, mb=10, promote=0.01, last=0.0, freq=1.0, **kw) -> Candidate:
    return Candidate(name, mb * MB, promote, last, freq, **kw)


def test_gdsf_keeps_frequent_expensive_small_models():
    hot = c("hot", freq=100)
    cold = c("cold", freq=1)
    big_cheap = c("big", mb=40, promote=0.005, freq=5)
    victims = GreedyDualSizeFrequency().choose([hot, cold, big_cheap], 30 * MB, 3, 0)
    assert victims is not None and "hot" not in [v.name for v in victims]
    assert sum(v.bytes for v in victims) >= 30 * MB


def test_pinned_models_are_never_victims_and_impossible_is_none():
    pinned = c("p", pinned=True)
    assert GreedyDualSizeFrequency().choose([pinned], 1, 1, 0) is None
    assert LeastRecentlyUsedByCount(1).choose([pinned], 0, 1, 0) is None
    assert GreedyDualSizeFrequency().choose([pinned, c("x")], 5 * MB, 2, 0) == [c("x")]


def test_value_ranks_victims_whether_or_not_they_are_busy():
    # A hot model idle for an instant is worth more than a cold one with a request in
    # flight: the owner drains the cold one rather than evict the hot one.
    busy = c("busy", freq=1, in_flight=3)
    idle = c("idle", freq=50)
    assert GreedyDualSizeFrequency().choose([busy, idle], MB, 2, 0)[0].name == "busy"


def test_gdsf_clock_ages_out_models_that_were_hot_long_ago():
    policy = GreedyDualSizeFrequency()
    old_hot = c("old", freq=20, credit=0.0)
    for i in range(50):  # churn of other models raises the clock
        policy.choose([c(f"n{i}", freq=5, credit=policy.clock)], MB, 1, 0)
    fresh = c("fresh", freq=3, credit=policy.clock)
    assert policy.clock > 0
    assert [v.name for v in policy.choose([old_hot, fresh], MB, 2, 0)] == ["old"]


def test_lru_by_count_evicts_least_recently_used_to_make_room():
    models = [c("a", last=3), c("b", last=1), c("c", last=2)]
    victims = LeastRecentlyUsedByCount(3).choose(models, 0, 3, 10)
    assert [v.name for v in victims] == ["b"]
    assert LeastRecentlyUsedByCount(5).choose(models, 0, 3, 10) == []


def test_ttl_only_evicts_models_idle_past_the_ttl():
    policy = IdleTimeToLive(5.0)
    models = [c("recent", last=8), c("idle", last=1)]
    assert [v.name for v in policy.choose(models, MB, 2, 10)] == ["idle"]
    assert policy.choose(models, 20 * MB, 2, 10) is None


def test_no_over_commit_refuses():
    assert NoOverCommit().choose([c("a")], MB, 1, 0) is None
    assert NoOverCommit().choose([c("a")], 0, 1, 0) == []


@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.floats(0.001, 1), st.floats(0, 100), st.booleans()),
        max_size=12,
    ),
    st.integers(0, 200),
)
def test_every_policy_frees_enough_or_says_impossible(specs, needed_mb):
    candidates = [c(f"m{i}", mb, p, freq=f, pinned=pin) for i, (mb, p, f, pin) in enumerate(specs)]
    movable = sum(x.bytes for x in candidates if not x.pinned)
    for policy in (GreedyDualSizeFrequency(), LeastRecentlyUsedByCount(100), IdleTimeToLive(0)):
        victims = policy.choose(candidates, needed_mb * MB, len(candidates), 1e9)
        if victims is None:
            assert movable < needed_mb * MB
        else:
            assert sum(v.bytes for v in victims) >= needed_mb * MB
            assert not any(v.pinned for v in victims)
            assert len({v.name for v in victims}) == len(victims)
