"""The room planner: pure decisions over a snapshot."""

from __future__ import annotations

import pytest

from edgeplex.agent.residency.planner import QueuedLoad, Slot, plan_room, victims_for
from edgeplex.agent.residency.state import ModelKey, Phase
from edgeplex.eviction import GreedyDualSizeFrequency, NoOverCommit

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


def test_a_model_live_sequences_hold_is_neither_evicted_nor_swapped():
    """A stateful model with live sequences stays as it is: a load waits for its room
    (nothing else can give it) until the sequences end, and a model beside it that
    may leave is taken instead when there is one."""
    held = Slot(key("held"), Phase.READY, 16 * MB, 0, False, in_sequence=True, frequency=0.1,
                smaller=4 * MB, smaller_form="int8")  # fmt: skip
    plan = plan_room(
        [held], [QueuedLoad(key("new"), 10 * MB)], 20 * MB, GreedyDualSizeFrequency(), 0
    )
    assert not plan.unload and not plan.drain and not plan.demote and not plan.start
    assert not plan.refuse  # it waits: the room comes when the sequences end
    plan = plan_room(
        [held, ready("other", held=4 * MB, freq=100)], [QueuedLoad(key("new"), 4 * MB)],
        20 * MB, GreedyDualSizeFrequency(), 0,
    )  # fmt: skip
    assert plan.unload == [key("other")]  # the load starts once its bytes are gone
    assert victims_for([held], 10 * MB, GreedyDualSizeFrequency(), 0) is None


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


def test_a_load_beside_the_plan_takes_room_only_from_models_not_placed_here():
    """A model a request alone asked for (the desired state does not place it at
    this site) evicts the models the site loaded on its own, however cold the
    placed ones are; a placed model's load may take room from either."""
    placed = Slot(key("placed"), Phase.READY, 10 * MB, 0, False, placed=True, frequency=0.1,
                  promote_s=1.0)  # fmt: skip
    slots = [placed, ready("own", freq=1e6)]  # far hotter than the placed one
    stray = QueuedLoad(key("stray"), 10 * MB, beside_plan=True)
    plan = plan_room(slots, [stray], 20 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.unload == [key("own")] and not plan.refuse
    planned = QueuedLoad(key("next"), 10 * MB)
    plan = plan_room(slots, [planned], 20 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.unload == [key("placed")]  # the colder one


def test_a_load_beside_the_plan_that_only_placed_models_could_make_room_for_is_refused():
    """Refused at once, naming why, rather than waiting for room the plan never gives;
    the loads behind it are not held back."""
    slots = [
        Slot(
            key("placed"), Phase.READY, 15 * MB, 0, False, placed=True, frequency=0.1, promote_s=1.0
        ),
        ready("own", held=5 * MB, freq=50),
    ]
    queue = [
        QueuedLoad(key("stray"), 8 * MB, beside_plan=True),
        QueuedLoad(key("small"), 5 * MB, beside_plan=True),
    ]
    plan = plan_room(slots, queue, 20 * MB, GreedyDualSizeFrequency(), 0)
    assert "placed at this site" in plan.refuse[key("stray")]
    assert plan.unload == [key("own")] and key("placed") not in plan.unload + plan.drain


def test_a_placed_model_that_comes_back_at_once_is_swapped_like_any_other():
    """Promotions faster than eviction.PLACED_KEPT_OVER_S cost a request little: a
    small site swaps its placed models for the ones its requests ask for."""
    cheap = Slot(key("placed"), Phase.READY, 10 * MB, 0, False, placed=True, frequency=0.1,
                 promote_s=0.001)  # fmt: skip
    stray = QueuedLoad(key("stray"), 10 * MB, beside_plan=True)
    plan = plan_room([cheap, ready("own", freq=50)], [stray], 20 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.unload == [key("placed")] and not plan.refuse


def test_an_unconfirmed_measurement_above_the_budget_loads_in_the_whole_room():
    """The likely bytes exceed the budget (one noisy measurement), the certain bytes
    do not: every movable model makes room and the load runs, to be measured again."""
    slots = [ready("a"), ready("b")]
    load = QueuedLoad(key("noisy"), needed=50 * MB, certain=10 * MB)
    plan = plan_room(slots, [load], 20 * MB, GreedyDualSizeFrequency(), 0)
    assert not plan.refuse and set(plan.unload) == {key("a"), key("b")}
    confirmed = QueuedLoad(key("noisy"), needed=50 * MB, certain=50 * MB)
    plan = plan_room(slots, [confirmed], 20 * MB, GreedyDualSizeFrequency(), 0)
    assert key("noisy") in plan.refuse and not plan.unload


def test_a_serving_model_with_a_smaller_variant_is_swapped_before_anything_is_evicted():
    """Room for a load comes first from swapping serving originals to their smaller
    usable variants in place (they stay resident); the variant's session is built
    beside the original, so a swap needs that much room free now."""
    big = Slot(key("big"), Phase.READY, 16 * MB, 0, False, smaller=4 * MB, smaller_form="int8")
    slots = [big, ready("other", held=10 * MB)]
    plan = plan_room(slots, [QueuedLoad(key("new"), 8 * MB)], 30 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.demote == {key("big"): "int8"} and not plan.unload and not plan.drain
    assert plan.start == []  # it waits for the swap to free the original's bytes
    # Planned again while the swap runs: its original counts as leaving; nothing moves.
    swapping = Slot(key("big"), Phase.READY, 20 * MB, 0, False, leaving=16 * MB)
    again = plan_room(
        [swapping, ready("other", held=10 * MB)],
        [QueuedLoad(key("new"), 8 * MB)],
        30 * MB,
        GreedyDualSizeFrequency(),
        0,
    )
    assert not again.demote and not again.unload and again.start == []
    # No room for the variant's session beside the original: evict instead.
    full = [big, ready("other", held=14 * MB)]
    plan = plan_room(full, [QueuedLoad(key("new"), 8 * MB)], 30 * MB, GreedyDualSizeFrequency(), 0)
    assert not plan.demote and plan.unload


def test_a_policy_that_does_not_evict_refuses_what_does_not_fit():
    plan = plan_room([ready("a")], [QueuedLoad(key("b"), 15 * MB)], 20 * MB, NoOverCommit(), 0)
    assert key("b") in plan.refuse and not plan.unload


def test_a_staged_models_promotion_is_estimated_from_the_sites_rate() -> None:
    """Routing weighs a peer's round trip against promoting here: a staged model
    never promoted here is estimated from its bytes at the rate this site's
    promotions have shown, instead of counting as unknown (which forwarded it to
    any peer, however far)."""
    from pathlib import Path

    from edgeplex.agent.catalog.repository import ModelSource
    from edgeplex.agent.residency.ledger import Ledger
    from edgeplex.agent.residency.state import ModelRecord

    ledger = Ledger()
    record = ModelRecord(key("m"), ModelSource("m", "1", Path("m.onnx"), None))
    record.staged_bytes = 20 * MB
    assert ledger.promote_estimate(record) is None  # nothing measured here yet
    ledger.observe_promotion(0.010, 10 * MB)  # 1 ms per MiB
    assert abs(ledger.promote_estimate(record) - 0.020) < 1e-9  # type: ignore[operator]
    record.usage.promote_s = 0.005  # its own measurement wins
    assert ledger.promote_estimate(record) == 0.005
    record.staged_bytes = 0  # cached: no estimate
    assert ledger.promote_estimate(record) is None


def test_a_load_that_did_more_than_a_promotion_estimates_only_until_one_is_measured():
    """A load for placement warms up and may prepack: its time stands in for this
    site's promotion rate only until a promotion on demand is measured, which then
    replaces it outright (an inflated estimate forwards what could be promoted)."""
    from edgeplex.agent.residency.ledger import Ledger

    ledger = Ledger()
    ledger.observe_promotion(0.050, 10 * MB, provisional=True)  # placement: 5 ms per MiB
    assert ledger.promote_s_per_byte == pytest.approx(0.005 / MB)
    ledger.observe_promotion(0.001, 10 * MB)  # on demand: 0.1 ms per MiB, at once
    assert ledger.promote_s_per_byte == pytest.approx(0.0001 / MB)
    ledger.observe_promotion(0.050, 10 * MB, provisional=True)  # ignored from now on
    assert ledger.promote_s_per_byte == pytest.approx(0.0001 / MB)
