"""The models a site's own demand keeps resident: which are hot, and how the
planner and the background rebuild treat them. Pure: no processes."""

from __future__ import annotations

from dataclasses import replace

from edgeplex.agent.residency.contract import Limits
from edgeplex.agent.residency.hot_set import Demand, hot_set, recent_requests
from edgeplex.agent.residency.planner import QueuedLoad, Slot, plan_room, victims_for
from edgeplex.agent.residency.state import Chore, ModelKey, Phase, Usage
from edgeplex.eviction import GreedyDualSizeFrequency

MB = 1 << 20


def key(name: str) -> ModelKey:
    return ModelKey(name, "1")


def zipf(count: int, size: int = 10 * MB) -> list[Demand]:
    return [Demand(key(f"m{i}"), 1000 / (i + 1), size) for i in range(count)]


def test_the_most_requested_models_are_hot_within_their_share_of_the_budget():
    # 16 models of 10 MB over Zipf 1/rank, a budget for 4: a model needs an eighth of
    # the requests. The first two have 0.30 and 0.15 of them; the third 0.10.
    assert hot_set(zipf(16), 40 * MB, 0.5) == {key("m0"), key("m1")}
    # Half the budget holds two: with a quarter, only the most requested.
    assert hot_set(zipf(16), 40 * MB, 0.25) == {key("m0")}
    # 160 models, a budget for 16: five have at least 1/32 of the requests.
    assert len(hot_set(zipf(160), 160 * MB, 0.5)) == 5
    assert hot_set(zipf(16), 40 * MB, 0.0) == set()
    assert hot_set(zipf(16), None, 0.5) == set()


def test_even_demand_makes_no_model_hot():
    even = [Demand(key(f"m{i}"), 50.0, 10 * MB) for i in range(16)]
    assert hot_set(even, 40 * MB, 0.5) == set()
    assert hot_set([], 40 * MB, 0.5) == set()


def test_a_model_too_big_for_the_hot_share_leaves_room_to_smaller_ones():
    demand = [
        Demand(key("big"), 600.0, 30 * MB),  # 0.6 of the requests, 0.75 of the budget
        Demand(key("small"), 300.0, 5 * MB),
        Demand(key("rare"), 100.0, 5 * MB),
    ]
    assert hot_set(demand, 40 * MB, 0.5) == {key("small"), key("rare")}


def test_recent_requests_halve_every_half_life():
    usage = Usage(last_used=100.0, frequency=8.0)
    assert recent_requests(usage, 100.0) == 8.0
    assert recent_requests(usage, 130.0) == 4.0
    assert recent_requests(Usage(), 130.0) == 0.0


def ready(name: str, leases: int = 0, credit: float = 0.0, hot: bool = False) -> Slot:
    return Slot(key(name), Phase.READY, 10 * MB, leases, False, hot=hot, credit=credit)


def test_a_load_drains_a_colder_model_before_it_evicts_a_hot_one():
    # The cold model was promoted last (GDSF's credit: a promotion costs next to
    # nothing, so recency decides) and has requests in flight; the hot one has none at
    # this instant. Without the hot set the hot model would go at once.
    slots = [ready("hot", hot=True), ready("cold", leases=2, credit=5.0)]
    load = [QueuedLoad(key("new"), 10 * MB)]
    plan = plan_room(slots, load, 20 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.drain == [key("cold")] and not plan.unload and not plan.start
    unmarked = [replace(s, hot=False) for s in slots]
    plan = plan_room(unmarked, load, 20 * MB, GreedyDualSizeFrequency(), 0)
    assert plan.unload == [key("hot")]


def test_loads_beyond_the_cold_room_wait_instead_of_evicting_hot_models():
    slots = [ready("h1", hot=True), ready("h2", hot=True), ready("c1"), ready("c2")]
    queue = [QueuedLoad(key(f"new{i}"), 10 * MB) for i in range(3)]
    plan = plan_room(slots, queue, 40 * MB, GreedyDualSizeFrequency(), 0)
    assert set(plan.unload) == {key("c1"), key("c2")}  # the third load waits
    assert not plan.drain and not plan.start  # (the first two, for the bytes to leave)
    leaving = [replace(s, phase=Phase.UNLOADING) if not s.hot else s for s in slots]
    again = plan_room(leaving, queue, 40 * MB, GreedyDualSizeFrequency(), 0)
    assert not again.unload and not again.drain


def test_a_load_that_cannot_fit_beside_the_hot_models_may_evict_them():
    slots = [ready("h1", hot=True), ready("h2", hot=True), ready("c1")]
    plan = plan_room(
        slots, [QueuedLoad(key("big"), 25 * MB)], 40 * MB, GreedyDualSizeFrequency(), 0
    )
    assert key("c1") in plan.unload and len(plan.unload) == 2  # one hot model goes too


def test_room_for_a_rebuild_or_a_budget_cut_comes_from_colder_models_first():
    slots = [ready("hot", hot=True), ready("cold", credit=5.0)]
    victims = victims_for(slots, 10 * MB, GreedyDualSizeFrequency(), 0)
    assert victims is not None and [v.key for v in victims] == [key("cold")]
    victims = victims_for(slots, 20 * MB, GreedyDualSizeFrequency(), 0)  # both must go
    assert victims is not None and len(victims) == 2


def test_hot_models_are_rebuilt_prepacked_without_waiting():
    from edgeplex.agent.residency.ledger import Ledger
    from edgeplex.agent.residency.upkeep import prepack_choice

    class Record:  # the fields prepack_choice reads
        def __init__(self, name: str, hot: bool, freq: float) -> None:
            self.key = key(name)
            self.phase, self.prepacked, self.chore, self.hot = Phase.READY, False, Chore.NONE, hot
            self.usage = Usage(loaded_at=99.0, frequency=freq)

    ledger = Ledger()
    ledger.by_key = {r.key: r for r in (Record("hot", True, 5), Record("busier", False, 9))}  # type: ignore[misc]
    limits = Limits(prepack=True, prepack_after_s=10.0)
    chosen = prepack_choice(ledger, limits, now=100.0, last_prepack=0.0)
    assert chosen is not None and chosen.key == key("hot")  # loaded 1 s ago, but hot
