"""A request's time limit and delay, from its model's queue policy and what its
caller gave: Triton's timeout_action and allow_timeout_override as the core reads
them (pure: no agent runs)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from edgeplex.agent.catalog.model_config import LevelPolicy, ModelConfig
from edgeplex.agent.core import DEFAULT_TIMEOUT_S, Agent, StepBody
from edgeplex.agent.oip.errors import DeadlineExceeded


def limit(config: ModelConfig | None, level: int = 0, **given: Any) -> tuple[float, float]:
    """(seconds the request may take, seconds after which it is delayed)."""
    record = SimpleNamespace(name="m", source=SimpleNamespace(config=config))
    body = StepBody([], None, given.get("timeout_s"), deadline_s=given.get("deadline_s"))
    return Agent._time_limit(record, body, level)  # type: ignore[arg-type]


def test_reject_takes_the_sooner_of_the_caller_and_the_model() -> None:
    config = ModelConfig(timeout_ms=2000)
    assert limit(config) == (2.0, math.inf)
    assert limit(config, timeout_s=0.5) == (0.5, math.inf)  # the parameter, allowed
    assert limit(config, timeout_s=5.0, deadline_s=5.0) == (2.0, math.inf)
    assert limit(None) == (DEFAULT_TIMEOUT_S, math.inf)  # a model whose config failed
    with pytest.raises(DeadlineExceeded, match="arrived past its deadline"):
        limit(config, timeout_s=0.0)


def test_without_the_override_only_a_grpc_deadline_shortens_the_model() -> None:
    config = ModelConfig(timeout_ms=2000, allow_timeout_override=False)
    assert limit(config, timeout_s=0.5) == (2.0, math.inf)  # the `timeout` parameter
    assert limit(config, timeout_s=0.5, deadline_s=0.5) == (0.5, math.inf)  # a deadline


def test_delay_moves_the_model_timeout_to_a_delay_and_the_caller_ends_it() -> None:
    config = ModelConfig(timeout_ms=2000, timeout_action="delay")
    assert limit(config) == (2.0 + DEFAULT_TIMEOUT_S, 2.0)
    assert limit(config, timeout_s=10.0) == (10.0, 2.0)
    assert limit(config, timeout_s=1.0) == (1.0, math.inf)  # over before any delay


def test_a_level_s_policy_overrides_the_model_s_field_by_field() -> None:
    config = ModelConfig(
        timeout_ms=2000,
        priority_levels=2,
        default_priority_level=1,
        priority_queue_policy={
            2: LevelPolicy(timeout_ms=300, timeout_action="delay", allow_timeout_override=False)
        },
    )
    assert limit(config, 1, timeout_s=1.0) == (1.0, math.inf)
    assert limit(config, 2, timeout_s=1.0) == (0.3 + DEFAULT_TIMEOUT_S, 0.3)
    assert config.queue_policy(2) == (300, True, False)
    assert config.queue_policy(1) == (2000, False, True)
