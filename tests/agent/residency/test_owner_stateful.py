"""The residency owner under random events, with a fake effects sink: no
processes, no event loop. Requests arrive and finish, loads and unloads finish
(or fail) in any order, runners die and come back, the budget shrinks and
grows, models are pinned and unpinned, placed and unplaced, sequences begin and
end, placement demotes models, time passes.

Invariants after every step:
- device bytes held by models that are staying never exceed the budget, and a
  load starts only where its bytes fit beside everything held;
- no model with leases (admitted requests queued or running) is unloaded;
- every admitted request ends served, at its own deadline, or with its model's
  own load failure; never refused for residency after admission;
- leases equal the requests holding them;
- a demote by placement waits for a serving model's live sequences, and only
  while they live and for at most its `sequence_drain_s`;
- nothing livelocks: once no effect is in flight and no request or sequence
  holds a model, no load is left waiting.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.forms import VariantReport
from edgeplex.agent.catalog.repository import scan_repository
from edgeplex.agent.config import ModelConfig
from edgeplex.agent.oip.errors import ModelFailed, ServeError
from edgeplex.agent.residency.contract import Limits, Loaded
from edgeplex.agent.residency.owner import Residency
from edgeplex.agent.residency.state import (
    HOLDS_DEVICE,
    Intent,
    ModelKey,
    ModelRecord,
    Phase,
    Tier,
)
from edgeplex.agent.residency.tickets import Ticket
from edgeplex.eviction import GreedyDualSizeFrequency, LeastRecentlyUsedByCount, kept_for_plan

MODELS = ["a", "b", "c", "d", "e"]
WIDTHS = {"a": 256, "b": 256, "c": 384, "d": 512, "e": 128}
ACCEPT_VARIANTS = {"a", "b", "c", "d"}  # with a usable INT8 variant, once built
VARIANTS = "variants: [int8]\nquality: any\n"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    repo = tmp_path_factory.mktemp("owner-repo")
    for i, name in enumerate(MODELS):
        config = VARIANTS if name in ACCEPT_VARIANTS else None
        demo.make_mlp(repo / name, width=WIDTHS[name], layers=3, seed=i, in_width=16, config=config)
        if config:  # a stand-in for its INT8 copy: a quarter of its bytes
            size = (repo / name / "1" / "model.onnx").stat().st_size
            (repo / f"{name}-int8.onnx").write_bytes(b"\0" * (size // 4))
    return scan_repository(Path(repo), ModelConfig())


class FakeEffects:
    """Records effects; the state machine decides when each one finishes."""

    def __init__(self) -> None:
        self.owner: Residency | None = None
        self.loads: dict[ModelKey, int] = {}
        self.fast: dict[ModelKey, bool] = {}  # each model's last load: without a warm-up?
        self.unloads: dict[ModelKey, int] = {}
        self.violations: list[str] = []
        self.reloading = False  # a runner came back: its models reload into their own room
        self.builds: dict[ModelKey, list[str]] = {}
        self.reforms: dict[ModelKey, tuple[int, str]] = {}
        self.stages: dict[ModelKey, str] = {}

    def load(self, record: ModelRecord, generation: int, fast: bool) -> None:
        assert self.owner is not None
        budget = self.owner.limits.device_budget
        if budget is not None and self.owner.device_bytes() > budget and not self.reloading:
            self.violations.append(f"load of {record.key} started over the budget")
        self.loads[record.key] = generation
        self.fast[record.key] = fast

    def unload(self, record: ModelRecord, generation: int) -> None:
        if record.leases:
            self.violations.append(f"{record.key} unloaded with {record.leases} leases")
        # Requests that arrived while it drained wait for its return (they hold no
        # lease and sit in no queue): unloading it is what they wait for.
        self.unloads[record.key] = generation

    def serve(self, record: ModelRecord) -> None: ...
    def pause(self, record: ModelRecord) -> None: ...
    def stage(self, record: ModelRecord, form: str = "") -> None:
        self.stages[record.key] = form

    def drop_staged(self, record: ModelRecord) -> None: ...
    def prepack(self, record: ModelRecord, generation: int) -> None: ...
    def queue_load(self, record: ModelRecord) -> None:
        return None  # no queues here: instances never change

    def scale(self, record: ModelRecord, instances: int) -> None: ...

    def build_variants(self, record: ModelRecord, forms: list[str]) -> None:
        self.builds[record.key] = forms

    def reform(self, record: ModelRecord, generation: int, form: str) -> None:
        self.reforms[record.key] = (generation, form)


def leaving(record: ModelRecord) -> bool:
    """Bytes on their way out: draining or unloading, or reloading after a runner
    death only to drain what it still owes its admitted requests."""
    if record.phase in (Phase.DRAINING, Phase.UNLOADING):
        return True
    retreating = record.intent in (Intent.STAGED, Intent.CACHED, Intent.RETIRE)
    return retreating and record.phase in (Phase.RECOVERING, Phase.LOADING)


def test_random_events_keep_the_residency_invariants(sources):
    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.now = 1000.0
            self.effects = FakeEffects()
            sizes = sorted(s.path.stat().st_size for s in sources.values())
            self.budget = int(sum(sizes[-3:]) * 1.1)  # about three of the five
            self.owner = Residency(
                Limits(device_budget=self.budget, max_pending_loads=3),
                GreedyDualSizeFrequency(),
                self.effects,
                clock=lambda: self.now,
            )
            self.effects.owner = self.owner
            for source in sources.values():
                self.owner.add(source)
            self.held: list[Ticket] = []  # granted, not yet released
            self.waiting: list[Ticket] = []  # admitted, waiting for a promotion
            self.failed_loads: set[ModelKey] = set()
            self.sequences: list[ModelRecord] = []  # live sequences, each holding its model
            self.shrunk = False

        # --- requests ---------------------------------------------------------------------

        @rule(name=st.sampled_from(MODELS), timeout=st.floats(0.05, 2.0))
        def arrive(self, name: str, timeout: float) -> None:
            try:
                ticket = self.owner.admit(name, "", self.now + timeout)
            except ServeError:
                return  # refused before admission: allowed
            (self.held if ticket.granted else self.waiting).append(ticket)

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 100))
        def finish(self, i: int) -> None:
            ticket = self.held.pop(i % len(self.held))
            self.owner.release(ticket)

        @precondition(lambda self: self.waiting)
        @rule(i=st.integers(0, 100))
        def waiter_goes_away(self, i: int) -> None:
            # The caller disconnected (its handler was cancelled) while it waited.
            ticket = self.waiting.pop(i % len(self.waiting))
            self.owner.release(ticket)
            if ticket.granted:  # it had been granted in the same step: a lease to end
                self.owner.release(ticket)

        @rule(dt=st.floats(0.01, 1.0) | st.just(6.0))  # now and then, a calm
        def time_passes(self, dt: float) -> None:
            self.now += dt
            for ticket in list(self.waiting):
                if ticket.settled:
                    continue
                if ticket.deadline <= self.now:
                    self.waiting.remove(ticket)
                    self.owner.abandon(ticket)  # ends at its own deadline
            self.owner.tick()

        # --- effects finishing ------------------------------------------------------------

        @precondition(lambda self: self.effects.loads)
        # A session measures at most its estimate, or (rarely) far more: the runner also
        # grew by what its other sessions allocated meanwhile.
        @rule(
            i=st.integers(0, 100),
            fail=st.booleans(),
            shrink=st.floats(0.5, 1.0) | st.floats(2.0, 4.0),
        )
        def load_finishes(self, i: int, fail: bool, shrink: float) -> None:
            key = sorted(self.effects.loads, key=str)[i % len(self.effects.loads)]
            generation = self.effects.loads.pop(key)
            record = self._record(key)
            if fail and i % 7 == 0:  # rarely: the model itself is broken
                self.failed_loads.add(key)
                self.owner.load_failed(key, generation, "broken")
                return
            size = int(record.estimate_bytes() * shrink) if record else 1
            self.owner.load_done(key, generation, Loaded(size, 0.01, size, False, "cached"))
            self._collect()

        @precondition(lambda self: self.effects.builds)
        @rule()
        def variants_finish(self) -> None:
            key, forms = self.effects.builds.popitem()
            record = self._record(key)
            assert record is not None and forms == ["int8"]
            path = record.source.path.parent.parent.parent / f"{key.name}-int8.onnx"
            report = VariantReport(
                form="int8", path=str(path), file_bytes=path.stat().st_size, usable=True
            )
            self.owner.variants_built(key, record.source.digest, [report])
            self._collect()

        @precondition(lambda self: self.effects.stages)
        @rule()
        def stage_finishes(self) -> None:
            key, form = self.effects.stages.popitem()
            record = self._record(key)
            if record is not None:
                self.owner.staged(key, record.estimate_bytes(form), form)

        @precondition(lambda self: self.effects.reforms)
        @rule(fail=st.booleans())
        def reform_finishes(self, fail: bool) -> None:
            key, (generation, form) = self.effects.reforms.popitem()
            record = self._record(key)
            size = record.estimate_bytes(form) if record else 1
            loaded = None if fail else Loaded(size, 0.01, size, False, "staged")
            self.owner.reformed(key, generation, form, loaded)
            self._collect()

        @precondition(lambda self: self.effects.unloads)
        @rule(i=st.integers(0, 100))
        def unload_finishes(self, i: int) -> None:
            key = sorted(self.effects.unloads, key=str)[i % len(self.effects.unloads)]
            self.owner.unload_done(key, self.effects.unloads.pop(key))
            self._collect()

        @rule()
        def runner_dies(self) -> None:
            self.owner.runner_down("shared-0")
            for key, generation in list(self.effects.loads.items()):
                record = self._record(key)
                if record is None or record.generation != generation:
                    del self.effects.loads[key]  # died with the runner; runner_up reloads
            self.effects.reloading = True
            self.owner.runner_up("shared-0")
            self.effects.reloading = False

        @rule(name=st.sampled_from(MODELS))
        def operator_demotes(self, name: str) -> None:
            # Room returns: a model goes back to staged once its requests are answered.
            self.owner.demote(name, Tier.STAGED)
            self._collect()

        @rule(name=st.sampled_from(MODELS), i=st.integers(0, 100))
        def placement_demotes(self, name: str, i: int) -> None:
            # Placement moves a model away (mostly one a sequence holds): after its
            # live sequences, for a while.
            if self.sequences and i % 4:
                name = self.sequences[i % len(self.sequences)].name
            self.owner.demote(name, Tier.STAGED, after_sequences=True)
            self._collect()

        @rule(name=st.sampled_from(MODELS), i=st.integers(0, 100))
        def sequence_begins(self, name: str, i: int) -> None:
            # Mostly at a serving model, where a sequence's START is served.
            serving = [r.name for r in self.owner.records() if r.phase == Phase.READY]
            if serving and i % 4:
                name = serving[i % len(serving)]
            record = self.owner.hold(name, "")
            if record is not None:
                self.sequences.append(record)

        @precondition(lambda self: self.sequences)
        @rule(i=st.integers(0, 100))
        def sequence_ends(self, i: int) -> None:
            self.owner.unhold(self.sequences.pop(i % len(self.sequences)))
            self._collect()

        @rule(name=st.sampled_from(MODELS), pinned=st.booleans())
        def pin(self, name: str, pinned: bool) -> None:
            self.owner.pin(name, pinned)

        @rule(names=st.sets(st.sampled_from(MODELS)))
        def placement(self, names: set[str]) -> None:
            # A desired state: loads beside it take no room from these.
            self.owner.set_placed(names)
            self._collect()

        @rule(scale=st.floats(0.6, 1.4))
        def budget_changes(self, scale: float) -> None:
            self.owner.set_device_budget(int(self.budget * scale))
            self.shrunk = True  # the excess leaves as loads settle and leases end

        # --- bookkeeping ------------------------------------------------------------------

        def _record(self, key: ModelKey) -> ModelRecord | None:
            return next((r for r in self.owner.ledger.all_records() if r.key == key), None)

        def _collect(self) -> None:
            for ticket in list(self.waiting):
                if not ticket.settled:
                    continue
                self.waiting.remove(ticket)
                if ticket.granted:
                    self.held.append(ticket)
                elif not isinstance(ticket.error, ModelFailed):
                    raise AssertionError(f"admitted, then refused: {ticket.error!r}")

        # --- invariants -------------------------------------------------------------------

        @invariant()
        def no_violation(self) -> None:
            assert not self.effects.violations, self.effects.violations
            self._collect()

        @invariant()
        def staying_bytes_fit(self) -> None:
            budget = self.owner.limits.device_budget
            assert budget is not None
            records = self.owner.ledger.all_records()
            staying = [r for r in records if not leaving(r)]
            total = sum(r.held_bytes for r in staying)
            if self.shrunk:  # a cut budget: what stays over it is pinned or still loading
                settling = (Phase.LOADING, Phase.RECOVERING)
                movable = [r for r in staying if not r.pinned and r.phase not in settling]
                assert not movable or total <= budget or all(r.held_bytes == 0 for r in movable), (
                    total,
                    budget,
                )
                if total <= budget:
                    self.shrunk = False
                return
            assert total <= budget, (total, budget)

        @invariant()
        def the_ledgers_index_matches_its_records(self) -> None:
            ledger = self.owner.ledger
            records = ledger.all_records()
            holding = {r.key for r in records if r.phase in HOLDS_DEVICE}
            assert {s.key for s in ledger.slots()} == holding
            assert ledger.queued() == sorted(
                (r for r in records if r.phase == Phase.QUEUED), key=lambda r: r.queued_at
            )
            assert ledger.device_bytes() == sum(r.held_bytes for r in records)

        @invariant()
        def leases_match_requests(self) -> None:
            for record in self.owner.ledger.all_records():
                mine = sum(1 for t in self.held if t.key == record.key)
                assert record.leases == mine, (record.key, record.leases, mine)

        @invariant()
        def a_demote_waits_for_sequences_only_while_they_live_and_not_too_long(self) -> None:
            for record in self.owner.ledger.all_records():
                if record.leave_by < float("inf"):
                    assert record.phase == Phase.READY and record.holds > 0, record
                    assert self.now < record.leave_by, (record.key, self.now)
                    assert record.intent in (Intent.STAGED, Intent.CACHED), record.intent

        @invariant()
        def nothing_livelocks(self) -> None:
            effects = self.effects
            quiet = not effects.loads and not effects.unloads and not effects.reforms
            quiet = quiet and not self.held and not self.sequences
            if quiet:
                # A queued load either runs or can never fit now (pins and the budget
                # leave no room; for a load beside the plan, the placed models too);
                # then only admitted requests keep it, until their deadlines.
                budget = self.owner.limits.device_budget or 0
                records = self.owner.ledger.all_records()
                pinned = self.owner.ledger.pinned_bytes()
                placed = sum(
                    s.held
                    for s in self.owner.ledger.slots()
                    if kept_for_plan(s.placed, s.promote_s) and not s.pinned
                )

                def room(r: ModelRecord) -> int:
                    beside_plan = not (r.placed or r.explicit)
                    return budget - pinned - (placed if beside_plan else 0)

                stuck = [
                    r.key
                    for r in records
                    if r.phase == Phase.QUEUED and (r.certain_bytes() <= room(r) or not r.waiters)
                ]
                assert not stuck, stuck

    Machine.TestCase.settings = settings(
        max_examples=200,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    Machine.TestCase().runTest()


def test_count_based_policy_keeps_its_limit(sources):
    effects = FakeEffects()
    owner = Residency(Limits(), LeastRecentlyUsedByCount(max_models=2), effects)
    effects.owner = owner
    for source in sources.values():
        owner.add(source)
    for name in MODELS:
        ticket = owner.admit(name, "", 1e12)
        while effects.loads or effects.unloads:
            for key, gen in list(effects.unloads.items()):
                del effects.unloads[key]
                owner.unload_done(key, gen)
            for key, gen in list(effects.loads.items()):
                del effects.loads[key]
                owner.load_done(key, gen, Loaded(100, 0.01, 100, False, "cached"))
        assert ticket.granted
        owner.release(ticket)
        serving = [r for r in owner.ledger.all_records() if r.phase in (Phase.READY, Phase.LOADING)]
        assert len(serving) <= 2


def _one_model(sources, budget_models: float):
    effects = FakeEffects()
    size = sources["a"].path.stat().st_size
    owner = Residency(
        Limits(device_budget=int(size * budget_models)),
        GreedyDualSizeFrequency(),
        effects,
        clock=lambda: 1000.0,
    )
    effects.owner = owner
    owner.add(sources["a"])
    return owner, effects, owner.ledger.get("a")


def _serve_once(owner, effects, record, measured: int) -> None:
    """One request: admitted, its load measures `measured` bytes, answered; a
    retreat the measurement set off is carried out."""
    ticket = owner.admit("a", "", 1e9)
    owner.load_done(
        record.key, effects.loads.pop(record.key), Loaded(measured, 0.01, 1, False, "cached")
    )
    assert ticket.granted
    owner.release(ticket)
    if record.key in effects.unloads:
        owner.unload_done(record.key, effects.unloads.pop(record.key))


def test_one_inflated_measurement_does_not_shut_a_model_out(sources):
    """A runner's memory grows by what its other sessions allocate meanwhile, so one
    measurement can count a neighbour's bytes. A model measured once above the whole
    budget leaves, but its next request loads it again and measures again; it is not
    refused for good on one sample."""
    owner, effects, record = _one_model(sources, 3.5)
    budget = owner.limits.device_budget
    _serve_once(owner, effects, record, 3 * budget)
    assert record.phase == Phase.ABSENT and "more than the budget" in record.reason
    _serve_once(owner, effects, record, record.source.path.stat().st_size)
    assert record.phase == Phase.READY
    assert record.estimate_bytes() < budget


def test_a_model_measured_twice_above_the_budget_is_refused_with_the_reason(sources):
    owner, effects, record = _one_model(sources, 3.5)
    budget = owner.limits.device_budget
    _serve_once(owner, effects, record, 3 * budget)
    _serve_once(owner, effects, record, 3 * budget)
    with pytest.raises(ServeError, match=r"needs \d+ bytes of device memory; the budget"):
        owner.admit("a", "", 1e9)


def test_a_model_loaded_as_a_variant_under_pressure_swaps_back_when_room_returns(sources):
    now = [1000.0]
    effects = FakeEffects()
    size = {n: s.path.stat().st_size for n, s in sources.items()}
    owner = Residency(
        Limits(device_budget=size["d"] + size["c"]),
        GreedyDualSizeFrequency(),
        effects,
        clock=lambda: now[0],
    )
    effects.owner = owner
    for source in sources.values():
        owner.add(source)
    owner.tick()  # variants are asked for on the tick
    while effects.builds:
        key, _ = effects.builds.popitem()
        path = sources[key.name].path.parent.parent.parent / f"{key.name}-int8.onnx"
        report = VariantReport(
            form="int8", path=str(path), file_bytes=path.stat().st_size, usable=True
        )
        owner.variants_built(key, sources[key.name].digest, [report])
    for key, form in list(effects.stages.items()):
        owner.staged(key, 1000, form)

    def serve(name: str):
        ticket = owner.admit(name, "", now[0] + 5)
        record = owner.get(name)
        if not ticket.granted:
            while record.key in effects.unloads:
                owner.unload_done(record.key, effects.unloads.pop(record.key))
            for key in list(effects.unloads):
                owner.unload_done(key, effects.unloads.pop(key))
            generation = effects.loads.pop(record.key)
            measured = record.estimate_bytes()
            owner.load_done(
                record.key, generation, Loaded(measured, 0.01, measured, False, "cached")
            )
        assert ticket.granted
        owner.release(ticket)
        return record

    serve("c")
    d = serve("d")  # the original does not fit beside c: d loads as its INT8 copy
    assert d.form == "int8"
    owner.demote("c", Tier.STAGED)
    owner.unload_done(owner.get("c").key, effects.unloads.pop(owner.get("c").key))
    now[0] += 6.0  # calm
    owner.tick()
    assert effects.reforms == {d.key: (d.generation, "")}
    generation, form = effects.reforms.pop(d.key)
    owner.reformed(d.key, generation, form, Loaded(size["d"], 0.01, size["d"], False, "staged"))
    assert d.form == "" and d.device_bytes == size["d"] and d.reserved_bytes == 0


def test_a_load_for_placement_is_not_taken_for_a_promotion_on_demand(sources):
    """A load that warmed up (and prepacked) took longer than bringing the model back
    on demand: routing keeps the model's last promotion on demand as its estimate,
    and eviction counts the load's work as what it would lose."""
    owner, effects, record = _one_model(sources, 3.5)
    ticket = owner.admit("a", "", 1e9)
    owner.load_done(
        record.key, effects.loads.pop(record.key), Loaded(100, 0.002, 1, False, "staged")
    )
    owner.release(ticket)
    owner.demote("a", Tier.STAGED)
    owner.unload_done(record.key, effects.unloads.pop(record.key))
    owner.load("a")
    owner.load_done(
        record.key,
        effects.loads.pop(record.key),
        Loaded(100, 0.030, 1, True, "staged", on_demand=False),
    )
    assert record.usage.promote_s == 0.002 and record.usage.setup_s == 0.030
    assert owner.ledger.slot(record).promote_s == pytest.approx(0.032)


def test_a_model_reloaded_after_its_runner_died_warms_up_unless_requests_wait(sources):
    effects = FakeEffects()
    owner = Residency(Limits(), GreedyDualSizeFrequency(), effects, clock=lambda: 1000.0)
    effects.owner = owner
    for source in sources.values():
        owner.add(source)
    for name in ("a", "b"):
        owner.load(name)
        key = owner.get(name).key
        assert effects.fast[key] is False  # asked for: it warms up
        owner.load_done(key, effects.loads.pop(key), Loaded(1000, 0.01, 1000, False, "cached"))
    held = owner.admit("a", "", 1010.0)
    assert held.granted  # a request on "a" when its runner dies
    owner.runner_down("shared-0", "killed")
    owner.runner_up("shared-0")
    assert effects.fast[owner.get("a").key] is True  # its request waits: no warm-up
    assert effects.fast[owner.get("b").key] is False  # idle: warmed up as before


DRAIN_S = 30.0


def test_placement_demotes_a_model_after_its_live_sequences(sources):
    """A model placement moves away keeps serving its live sequences (their state is
    here): it leaves when the last one ends, or `sequence_drain_s` after the demote, and
    a load before then keeps it. An operator's demote does not wait."""
    now = [1000.0]
    effects = FakeEffects()
    owner = Residency(
        Limits(sequence_drain_s=DRAIN_S), GreedyDualSizeFrequency(), effects, clock=lambda: now[0]
    )
    effects.owner = owner
    owner.add(sources["a"])
    record = owner.get("a")
    owner.load("a")
    owner.load_done(record.key, effects.loads.pop(record.key), Loaded(1000, 0.01, 1000, False, ""))

    def serving_after_placement_demotes() -> None:
        assert owner.demote("a", Tier.STAGED, after_sequences=True).settled
        owner.tick()
        assert record.phase == Phase.READY and not effects.unloads

    owner.hold("a", "")
    owner.hold("a", "")
    serving_after_placement_demotes()
    owner.unhold(record)
    assert record.phase == Phase.READY  # one sequence still lives
    owner.unhold(record)  # the last one ends: it leaves
    assert record.phase == Phase.UNLOADING and record.key in effects.unloads
    owner.unload_done(record.key, effects.unloads.pop(record.key))
    assert record.phase == Phase.ABSENT

    owner.load("a")
    owner.load_done(record.key, effects.loads.pop(record.key), Loaded(1000, 0.01, 1000, False, ""))
    owner.hold("a", "")
    serving_after_placement_demotes()
    now[0] += DRAIN_S - 1
    owner.tick()
    assert record.phase == Phase.READY
    now[0] += 1
    owner.tick()  # the sequence outlasted the wait: it leaves anyway
    assert record.phase == Phase.UNLOADING
    owner.unload_done(record.key, effects.unloads.pop(record.key))
    owner.unhold(record)

    owner.load("a")
    owner.load_done(record.key, effects.loads.pop(record.key), Loaded(1000, 0.01, 1000, False, ""))
    owner.hold("a", "")
    serving_after_placement_demotes()
    owner.load("a")  # placement wants it here again
    owner.unhold(record)
    now[0] += DRAIN_S
    owner.tick()
    assert record.phase == Phase.READY and record.intent == Intent.NONE

    owner.hold("a", "")
    owner.demote("a", Tier.STAGED)  # the operator's: at once
    assert record.phase == Phase.UNLOADING
    owner.unload_done(record.key, effects.unloads.pop(record.key))

    owner.limits = replace(owner.limits, sequence_drain_s=0.0)  # set to 0: no wait
    owner.load("a")
    owner.load_done(record.key, effects.loads.pop(record.key), Loaded(1000, 0.01, 1000, False, ""))
    owner.demote("a", Tier.STAGED, after_sequences=True)
    assert record.phase == Phase.UNLOADING
