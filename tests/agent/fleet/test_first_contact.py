"""No trust on first use over clear text: an agent refuses to register with a
control plane, or to take desired state from a broker, in clear text beyond its own
host, unless fleet.allow_plaintext says the network is closed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from edgeplex.agent.config import FleetSettings
from edgeplex.agent.fleet.link import check_first_contact
from tests.conftest import agent_command

CA = Path("/nonexistent/ca.pem")  # only whether it is set matters here


def fleet(**values: object) -> FleetSettings:
    return FleetSettings(site_id="s1", region="r", **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "values",
    [
        {"control_plane": "192.0.2.1:7070", "mqtt_url": "mqtts://192.0.2.1:8883"},
        {"control_plane": "127.0.0.1:7070,cp.example.net:7070", "mqtt_url": "mqtt://127.0.0.1"},
        {"control_plane": "192.0.2.1:7070", "tls_ca": CA, "mqtt_url": "mqtt://192.0.2.1:1883"},
        {"control_plane": "[2001:db8::1]:7070", "mqtt_url": "mqtt://[::1]:1883"},
    ],
)
def test_clear_text_beyond_loopback_is_refused(values: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="clear text"):
        check_first_contact(fleet(**values))
    check_first_contact(fleet(**values, allow_plaintext=True))  # a closed network, said so


@pytest.mark.parametrize(
    "values",
    [
        {"control_plane": "127.0.0.1:7070", "mqtt_url": "mqtt://localhost:1883"},
        {"control_plane": "[::1]:7070", "mqtt_url": "mqtt://127.0.0.1"},
        {"control_plane": "cp.example.net:7070", "tls_ca": CA, "mqtt_url": "mqtts://b.example"},
    ],
)
def test_loopback_or_tls_is_accepted(values: dict[str, object]) -> None:
    check_first_contact(fleet(**values))


def test_the_agent_refuses_to_start_and_says_why(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": "t",
        "EDGEPLEX_AGENT_FLEET__CONTROL_PLANE": "192.0.2.1:7070",
        "EDGEPLEX_AGENT_FLEET__SITE_ID": "s1",
        "EDGEPLEX_AGENT_FLEET__REGION": "r",
        "EDGEPLEX_AGENT_FLEET__MQTT_URL": "mqtt://192.0.2.1:1883",
        "EDGEPLEX_AGENT_FLEET__JOIN_TOKEN": "ejt_x",
    }
    result = subprocess.run(
        agent_command(repo, 0, 0), env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "refusing to join the fleet in clear text" in result.stdout + result.stderr
    assert "192.0.2.1:7070" in result.stdout + result.stderr


def test_an_empty_join_token_stops_the_agent_saying_why() -> None:
    with pytest.raises(ValueError, match="join_token is set but empty"):
        check_first_contact(
            fleet(control_plane="127.0.0.1:7070", mqtt_url="mqtt://127.0.0.1", join_token="")
        )
    check_first_contact(fleet(control_plane="127.0.0.1:7070", mqtt_url="mqtt://127.0.0.1"))
