"""Placement's local search: hill-climbing on the exact objective after the
greedy rounds, on instances small enough (`SWAP_SEARCH_LIMIT` in
placement.py). It recovers what greedy-by-density strands, the knapsack case.

Called only by `placement.place`, with its working arrays, which it updates
in place.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeplex.control_plane.placement import _Problem as Problem

MAKE_ROOM_CANDIDATES = 32  # models per site tried with "drop the cheapest bytes until it fits"


def improve(  # type: ignore[no-untyped-def]
    p: Problem,
    site_region: list[int],
    loaded: list[list[int]],
    holds: list[set[int]],
    free: list[float],
    current: list[set[int]],
    may_hold,
    churn_per_byte: float,
    locked: set[int],
    max_passes: int = 8,
) -> None:
    """Hill-climb on the exact objective: per site, drop none, one or two models
    and refill the room greedily (by gain, or by gain per byte), keeping the best
    move, until a pass improves nothing. Pinned models stay, and no
    model drops below its minimum replicas."""
    n_m = len(p.models)
    holders_by_region: list[dict[int, int]] = [{} for _ in range(n_m)]
    for i, placed in enumerate(loaded):
        for j in placed:
            counts = holders_by_region[j]
            counts[site_region[i]] = counts.get(site_region[i], 0) + 1
    demanded = [j for j in range(n_m) if p.value_m[j].sum() > 0]

    def contrib(j: int, regions: list[int]) -> float:
        if not regions:
            return 0.0
        return float(p.value_m[j] @ p.w_m[j][:, regions].max(axis=1))

    def add_gain(j: int, r: int) -> float:
        regions = list(holders_by_region[j])
        if r in regions:
            return 0.0
        return contrib(j, [*regions, r]) - contrib(j, regions)

    def remove_loss(j: int, r: int) -> float:
        counts = holders_by_region[j]
        if counts.get(r, 0) > 1:
            return 0.0
        regions = list(counts)
        return contrib(j, regions) - contrib(j, [x for x in regions if x != r])

    def churn(i: int, j: int) -> float:
        return 0.0 if j in current[i] else churn_per_byte * p.sizes_at(i)[j]

    for _ in range(max_passes):
        improved = False
        for i, r in enumerate(site_region):
            sizes = p.sizes_at(i)  # a model's bytes here: its variant's where it runs one
            adds = sorted(
                (
                    (add_gain(j, r) - churn(i, j), j)
                    for j in demanded
                    if j not in holds[i] and may_hold(i, j)
                ),
                reverse=True,
            )
            removable = [
                (remove_loss(out, r) - churn(i, out), out)  # removing a new one refunds churn
                for out in loaded[i]
                if out not in locked
                and sum(holders_by_region[out].values()) > p.models[out].min_replicas
            ]
            outs: list[tuple[float, list[int]]] = [(0.0, [])]
            outs += [(loss, [out]) for loss, out in removable]
            outs += [(a[0] + b[0], [a[1], b[1]]) for a, b in itertools.combinations(removable, 2)]
            by_density = sorted(adds, key=lambda t: -t[0] / sizes[t[1]])
            best_gain, move = 1e-9, None
            for loss, dropped in outs:
                space = free[i] + sum(sizes[d] for d in dropped)
                for order in (adds, by_density):
                    gain, taken, room = -loss, [], space
                    for g, j in order:
                        if g > 0 and sizes[j] <= room:
                            gain, room = gain + g, room - sizes[j]
                            taken.append(j)
                    if taken and gain > best_gain:
                        best_gain, move = gain, (taken, dropped)
            # Make room for one large model: drop the cheapest bytes until it fits.
            cheapest = sorted(removable, key=lambda t: t[0] / sizes[t[1]])
            for g, j in adds[:MAKE_ROOM_CANDIDATES]:
                if g <= best_gain:
                    break
                need, lost, dropped = sizes[j] - free[i], 0.0, []
                for loss, out in cheapest:
                    if need <= 0 or g - lost <= best_gain:
                        break
                    need, lost = need - sizes[out], lost + loss
                    dropped.append(out)
                if need <= 0 and g - lost > best_gain:
                    best_gain, move = g - lost, ([j], dropped)
            if move is None:
                continue
            taken, dropped = move
            for out in dropped:
                loaded[i].remove(out)
                holds[i].discard(out)
                free[i] += sizes[out]
                counts = holders_by_region[out]
                counts[r] -= 1
                if not counts[r]:
                    del counts[r]
            for j in taken:
                loaded[i].append(j)
                holds[i].add(j)
                free[i] -= sizes[j]
                holders_by_region[j][r] = holders_by_region[j].get(r, 0) + 1
            improved = True
        if not improved:
            return
