"""schemathesis against a live agent, from the OpenAPI document it serves: every
operation, with generated valid and invalid inputs, answers without a 5xx, and
the agent still serves afterwards."""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from edgeplex.agent.frontdoor.openapi import document
from tests.conftest import AUTH

schema = schemathesis.openapi.from_dict(document())
# Valid inputs and invalid ones (types, formats, missing fields), both.
schema.config.generation.update(modes=list(schemathesis.GenerationMode))


@pytest.fixture(scope="module")
def base_url(agent) -> str:  # type: ignore[no-untyped-def]
    _, served = agent.http_get("/openapi.json")
    assert json.loads(served) == json.loads(json.dumps(document()))
    return f"http://{agent.http_url}"


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_operation_answers_5xx(case, base_url):  # type: ignore[no-untyped-def]
    headers = (
        AUTH if case.path.startswith(("/edgeplex/v1/models", "/v2/repository/models")) else None
    )
    response = case.call(base_url=base_url, headers=headers, timeout=30)
    # 504 is what a request whose own tiny `timeout` passed asked for.
    if response.status_code != 504:
        case.validate_response(response, checks=[not_a_server_error])


def test_the_agent_still_serves(agent):  # type: ignore[no-untyped-def]
    assert agent.http_get("/v2/health/ready")[0] == 200
