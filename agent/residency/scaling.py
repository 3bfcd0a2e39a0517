"""How many instances a serving model runs: elastic instances as a pure decision
over what its queue holds (the owner asks it every tick and applies it)."""

from __future__ import annotations


def scale_target(
    *,
    depth: int,
    instances: int,
    minimum: int,
    maximum: int,
    max_batch_size: int,
    idle_s: float,
    scale_down_idle_s: float,
) -> int:
    """Elastic instances, as a pure decision: one more instance while the queue holds
    more than the running instances can take in one round (a full batch each), back
    to `minimum` once the queue has been empty for `scale_down_idle_s`."""
    per_round = instances * max(1, max_batch_size)
    if depth > per_round and instances < maximum:
        return instances + 1
    if depth == 0 and idle_s >= scale_down_idle_s and instances > minimum:
        return minimum
    return instances
