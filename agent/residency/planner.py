"""Where device memory comes from for the loads that wait for it: a pure planner.

`plan_room` looks at a snapshot (every model's phase, bytes held, leases, pins
and usage; the queued loads in arrival order; the budget) and decides, for the
whole queue at once:

- which queued loads start now (their bytes fit beside everything held);
- which models to unload now (victims without leases; never a pinned model or
  one that live sequences hold: a stateful model stays until its sequences end
  or idle out);
- which to drain (victims with leases: they admit nothing more and are
  unloaded when their admitted requests have been answered, which their
  deadlines bound); a load that fits beside the hot models (hot_set.py)
  takes its victims from the others, waiting for them if need be;
- which loads can never fit (they need more than the budget minus the pins);
- a load that only a request asked for, of a model the control plane's desired
  state does not place at this site, takes no room from the placed models
  whose promotion is slow (eviction.kept_for_plan), and is refused when the
  pins and those leave too little: what a site loads on its own lives in the
  room the plan leaves, and never pushes out a model placement put there
  whose requests would then leave the region until the next placement;
- which loads start as a smaller variant: a model that accepts one loads as
  its smallest usable variant when its original would take room from others,
  or while room has been short lately;
- which serving models swap to their smaller variant in place (they stay
  resident) before any model is evicted for room.

Loads are served first come, first served: a load that cannot get room yet
holds back the ones behind it, so a large model is never starved by a stream
of small ones. At most `max_promotions` loads are in flight or promised room
at once; the others wait without evicting anything. Bytes already leaving
(draining or unloading models) and bytes promised to earlier loads are
counted, so the same room is never promised twice and each event asks for at
most the victims still missing.

Pure: no clocks, no I/O, no logging. The owner calls it after every event that
changes bytes, leases or the queue; tests call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeplex.agent.residency.state import ModelKey, Phase
from edgeplex.eviction import Candidate, EvictionPolicy, kept_for_plan

# Slot, QueuedLoad and Candidate are values, never changed once built, but not
# frozen: a plan builds one of each per model after nearly every event, and a
# frozen dataclass takes six times as long to build.


@dataclass(slots=True)
class Slot:
    """One model as the planner sees it."""

    key: ModelKey
    phase: Phase
    held: int  # device bytes held now (session or reservation)
    leases: int
    pinned: bool
    placed: bool = False  # the desired state loads it here (eviction.kept_for_plan)
    in_sequence: bool = False  # live sequences hold it: neither a victim nor swapped
    hot: bool = False  # promotions take room from it last (hot_set.py)
    priority: int = 0
    last_used: float = 0.0
    frequency: float = 0.0
    credit: float = 0.0
    promote_s: float = 0.0
    # Bytes that leave when work in flight ends (a swap to another form: the old
    # session's), and the bytes of a smaller usable variant it may swap to in place.
    leaving: int = 0
    smaller: int = 0
    smaller_form: str = ""


@dataclass(slots=True)
class QueuedLoad:
    key: ModelKey
    needed: int  # the bytes it will likely hold
    certain: int = 0  # the bytes it surely needs: above the budget's room, it is refused
    # A smaller usable variant it may load as instead: (form, needed, certain).
    smaller: tuple[str, int, int] | None = None
    # A model this site loads on its own (a request asked for it; the control
    # plane's desired state does not place it here): it takes no room from the
    # placed models kept for the plan, and is refused when what they and the pins
    # leave is too small.
    beside_plan: bool = False


@dataclass
class RoomPlan:
    start: list[ModelKey] = field(default_factory=list)
    unload: list[ModelKey] = field(default_factory=list)
    drain: list[ModelKey] = field(default_factory=list)
    refuse: dict[ModelKey, str] = field(default_factory=dict)
    forms: dict[ModelKey, str] = field(default_factory=dict)  # loads that start as a variant
    demote: dict[ModelKey, str] = field(default_factory=dict)  # serving models swapped smaller


LEAVING = (Phase.DRAINING, Phase.UNLOADING)
# Models that count against a count-based policy's limit.
COUNTED = (Phase.LOADING, Phase.READY, Phase.RECOVERING)


def plan_room(
    slots: list[Slot],
    queue: list[QueuedLoad],
    budget: int | None,
    policy: EvictionPolicy,
    now: float,
    max_promotions: int | None = None,
    pressed: bool = False,
) -> RoomPlan:
    plan = RoomPlan()
    # Promotions in flight, and promised room: at most `max_promotions` at once. The
    # runner creates sessions one after another, so room made now for a load that
    # will wait behind others is room taken from serving models for nothing; its
    # victims are better chosen when its turn comes.
    promotions = sum(1 for s in slots if s.phase == Phase.LOADING)
    held = sum(s.held for s in slots)
    leaving = sum(s.held if s.phase in LEAVING else s.leaving for s in slots)
    pinned = sum(s.held for s in slots if s.pinned and s.phase not in LEAVING)
    hot = sum(s.held for s in slots if s.hot and not s.pinned and s.phase not in LEAVING)
    plan_kept = [
        s
        for s in slots
        if kept_for_plan(s.placed, s.promote_s) and not s.pinned and s.phase not in LEAVING
    ]
    placed = sum(s.held for s in plan_kept)  # room a load beside the plan may not take
    placed_hot = sum(s.held for s in plan_kept if s.hot)
    kept_keys = {s.key for s in plan_kept}
    counted = sum(1 for s in slots if s.phase in COUNTED)
    # Victims, and models swapped to a smaller form, come from these.
    movable = {s.key: s for s in slots if _may_leave(s) and not s.leaving}
    seen: dict[ModelKey, Candidate] = {}  # each movable model as the policy sees it
    claimed = 0  # bytes promised to earlier loads of the queue that wait for room
    for load in queue:
        needed, certain = load.needed, max(1, load.certain or load.needed)
        kept = pinned + placed if load.beside_plan else pinned  # bytes it may not take
        # A variant when the original would take room from others or never fits, and
        # while room has been short lately (`pressed`): an original loaded into room
        # that an eviction just made would only push out the next model.
        squeezed = budget is not None and (
            pressed or held + claimed + needed > budget or certain > budget - kept
        )
        if load.smaller is not None and squeezed:
            form, needed, certain = load.smaller
            plan.forms[load.key] = form
        if budget is not None:
            if certain > budget - kept:
                why = f"needs {certain} bytes of device memory; the budget is {budget}"
                plan.refuse[load.key] = (
                    f"{why} and pinned models hold {pinned}"
                    if kept == pinned
                    else f"{why}, pinned models hold {pinned} and the models placed at this "
                    f"site {placed}, which a model it was not asked to hold takes no room from"
                )
                continue
            needed = min(needed, budget - kept)
        if max_promotions is not None and promotions >= max_promotions:
            continue  # later: only loads that can never fit are answered now
        if not policy.evicts_on_demand:
            if budget is None or held + claimed + needed <= budget:
                plan.start.append(load.key)
                held += needed
                counted += 1
                promotions += 1
            else:
                free = max(0, budget - held - claimed)
                plan.refuse[load.key] = (
                    f"needs {needed} bytes of device memory and {free} are free "
                    f"(budget {budget}, policy {policy.name} does not evict on demand)"
                )
            continue
        staying = held - leaving + claimed
        deficit = 0 if budget is None else staying + needed - budget
        if deficit > 0 and budget is not None:
            # Swapping a serving model to its smaller variant keeps it resident, where
            # an eviction would not. The variant's session is built beside the original,
            # so it must fit in the room free now.
            for slot in sorted(movable.values(), key=lambda s: s.smaller - s.held):
                if deficit <= 0:
                    break
                if not slot.smaller or budget - held - claimed < slot.smaller:
                    continue
                del movable[slot.key]
                plan.demote[slot.key] = slot.smaller_form
                held += slot.smaller
                leaving += slot.held
                deficit -= slot.held - slot.smaller
        # Hot models make room only for a load that cannot fit beside them; the
        # others wait for colder models to drain, or for loads before them to settle.
        # A load beside the plan takes its victims from the models not placed here.
        spare = (
            {k: s for k, s in movable.items() if k not in kept_keys}
            if load.beside_plan and kept_keys
            else movable
        )
        others_hot = hot - placed_hot if load.beside_plan else hot
        beside_hot = others_hot and budget is not None and needed <= budget - kept - others_hot
        spare = _cold(spare) if beside_hot else spare
        victims = _choose(spare, max(0, deficit), counted, policy, now, seen)
        if victims is None:
            break  # room comes later (loads settling, leases ending); first come, first served
        for slot in victims:
            del movable[slot.key]
            (plan.drain if slot.leases else plan.unload).append(slot.key)
            leaving += slot.held
            counted -= 1
        if budget is None or held + claimed + needed <= budget:
            plan.start.append(load.key)
            held += needed
        else:
            claimed += needed  # waits for the victims' bytes
        counted += 1
        promotions += 1
    return plan


def victims_for(
    slots: list[Slot], needed: int, policy: EvictionPolicy, now: float
) -> list[Slot] | None:
    """Serving models that may leave (`_may_leave`) whose bytes add up to `needed`, or
    None: from the models that are not hot when they can make it (hot_set.py)."""
    movable = {s.key: s for s in slots if _may_leave(s)}
    counted = sum(1 for s in slots if s.phase in COUNTED)
    cold = _cold(movable)
    if len(cold) < len(movable):
        victims = _choose(cold, needed, counted - 1, policy, now)
        if victims is not None:
            return victims
    return _choose(movable, needed, counted - 1, policy, now)


def movable(slots: list[Slot]) -> list[Slot]:
    """Every serving, unpinned model: what a budget cut with no better choice takes,
    models that live sequences hold included (the operator's budget comes first)."""
    return [s for s in slots if s.phase == Phase.READY and not s.pinned]


def _may_leave(slot: Slot) -> bool:
    """A serving model the planner may evict or swap: neither pinned nor held by live
    sequences."""
    return slot.phase == Phase.READY and not slot.pinned and not slot.in_sequence


def _cold(movable: dict[ModelKey, Slot]) -> dict[ModelKey, Slot]:
    """The movable models that are not hot (hot_set.py)."""
    return {key: s for key, s in movable.items() if not s.hot}


def _choose(
    movable: dict[ModelKey, Slot],
    needed: int,
    counted: int,
    policy: EvictionPolicy,
    now: float,
    seen: dict[ModelKey, Candidate] | None = None,
) -> list[Slot] | None:
    """The policy's victims among `movable`; `seen` keeps the candidates built for
    earlier loads of one plan (a slot does not change within a plan)."""
    seen = {} if seen is None else seen
    candidates = []
    for key, slot in movable.items():
        each = seen.get(key)
        if each is None:
            each = seen[key] = candidate(slot)
        candidates.append(each)
    victims = policy.choose(candidates, needed, counted, now)
    if not victims:
        return None if victims is None else []
    by_name = {str(key): slot for key, slot in movable.items()}
    return [by_name[v.name] for v in victims]


def candidate(slot: Slot) -> Candidate:
    """The policy's view of a model."""
    return Candidate(
        name=str(slot.key),
        bytes=slot.held,
        promote_s=slot.promote_s,
        last_used=slot.last_used,
        frequency=slot.frequency,
        priority=slot.priority,
        pinned=slot.pinned,
        in_flight=slot.leases,
        credit=slot.credit,
    )
