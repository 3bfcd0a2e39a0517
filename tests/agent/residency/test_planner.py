"""The room planner: pure decisions over a snapshot."""

from __future__ import annotations

from edgeplex.agent.residency.planner import QueuedLoad, Slot, plan_room
from edgeplex.agent.residency.policies import GreedyDualSizeFrequency, NoOverCommit
from edgeplex.agent.residency.state import ModelKey, Phase

MB = 1 << 20


def key(name: str) -> ModelKey:
    return ModelKey(name, "1")


def ready(name: str, held: int = 10 * MB, leases: int = 0, freq: float = 1.0, pinned=False):
    return Slot(key(name), Phase.READY, held, leases, pinned, frequency=freq, promote_s=0.01)


def test_a_load_that_fits_starts_and_nothing_moves():
    plan = plan_room(
        [ready("a")], [QueuedLoad(key("b"), 10 * MB)], 30 * MB, GreedyDualSizeFrequency(), 0
    )
    assert plan.start == [key("b")] and not plan.unload and not plan.drain


def test_a_victim_with_leases_drains_one_without_is_unloaded():
    slots = [ready("cold", leases=2, freq=1), ready("hot", freq=100)]
    plan = plan_room(
        slots, [QueuedLoad(key("new"), 10 * MB)], 20 * MB, GreedyDualSizeFrequency(), 0
    )
    assert plan.drain == [key("cold")] and not plan.unload
    assert plan.start == []  # it waits for the drained bytes
    slots = [ready("cold", freq=1), ready("hot", freq=100)]
    plan = plan_room(
        slots, [QueuedLoad(key("new"), 10 * MB)], 20 * MB, GreedyDualSizeFrequency(), 0
    )
    assert plan.unload == [key("cold")]


def test_room_is_never_promised_twice_and_loads_are_first_come_first_served():
    slots = [ready("a", freq=1), ready("b", freq=2)]
    queue = [QueuedLoad(key("x"), 10 * MB), QueuedLoad(key("y"), 10 * MB)]
    plan = plan_room(slots, queue, 20 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.unload == [key("a"), key("b")]  # one victim for each load
    # Planned again while those unloads are in flight: nothing more is evicted.
    leaving = [
        Slot(key("a"), Phase.UNLOADING, 10 * MB, 0, False),
        Slot(key("b"), Phase.UNLOADING, 10 * MB, 0, False),
    ]
    again = plan_room(leaving, queue, 20 * MB, GreedyDualSizeFrequency(), 0)
    assert not again.unload and not again.drain and not again.start


def test_a_load_bigger_than_the_budget_beside_the_pins_is_refused():
    plan = plan_room(
        [ready("pinned", held=15 * MB, pinned=True)],
        [QueuedLoad(key("big"), 10 * MB)],
        20 * MB,
        GreedyDualSizeFrequency(),
        0,
    )
    assert key("big") in plan.refuse and "pinned" in plan.refuse[key("big")]


def test_a_policy_that_does_not_evict_refuses_what_does_not_fit():
    plan = plan_room([ready("a")], [QueuedLoad(key("b"), 15 * MB)], 20 * MB, NoOverCommit(), 0)
    assert key("b") in plan.refuse and not plan.unload
