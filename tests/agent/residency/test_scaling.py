"""Elastic instances as a pure decision (residency/scaling.py)."""

from __future__ import annotations

from edgeplex.agent.residency.scaling import scale_target


def test_scale_target_grows_under_a_deep_queue_and_shrinks_when_idle():
    common = {"minimum": 1, "maximum": 4, "max_batch_size": 2, "scale_down_idle_s": 5.0}
    assert scale_target(depth=5, instances=2, idle_s=0, **common) == 3
    assert scale_target(depth=4, instances=2, idle_s=0, **common) == 2  # one round absorbs it
    assert scale_target(depth=50, instances=4, idle_s=0, **common) == 4  # at the maximum
    assert scale_target(depth=0, instances=3, idle_s=6, **common) == 1
    assert scale_target(depth=0, instances=3, idle_s=1, **common) == 3
