"""Triton's logging extension: the agent's log settings read by clients and changed
with the admin token, over both doors, taking effect at once, in the runners too."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.observability.log_settings import LogSettings
from edgeplex.agent.oip.errors import InvalidInput
from tests.conftest import AUTH, start_agent

ADMIN = AUTH  # lower case: gRPC metadata needs it


def test_the_toggles_nest_into_one_level_and_read_back_as_set() -> None:
    logger = logging.getLogger("edgeplex.test.log-settings")
    logger.setLevel(logging.INFO)
    settings = LogSettings(logger)
    assert settings.view() == {
        "log_file": "", "log_info": True, "log_warnings": True, "log_errors": True,
        "log_verbose_level": 0, "log_format": "default",
    }  # fmt: skip
    assert settings.update({"log_info": False})["log_info"] is False
    assert logger.level == logging.WARNING
    settings.update({"log_verbose_level": 2})
    assert logger.level == logging.DEBUG
    settings.update({"log_verbose_level": 0, "log_warnings": False, "log_errors": False})
    assert logger.level > logging.CRITICAL  # nothing at all
    for bad, said in (
        ({"log_info": "yes"}, "'log_info' must be true or false"),
        ({"log_verbose_level": -1}, "non-negative integer"),
        ({"log_file": "agent.log"}, "'log_file' is set when the agent starts"),
        ({"log_colour": True}, "no setting 'log_colour'"),
        ({"log_errors": True, "log_info": 1}, "'log_info' must be true or false"),
    ):
        with pytest.raises(InvalidInput, match=said):
            settings.update(bad)
    assert logger.level > logging.CRITICAL  # a refused change changes nothing


def test_clients_read_the_settings_and_the_admin_changes_them(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("quiet", "heard", "verbose"):
        demo.make_add_sub(repo / name)
    # Explicit mode: nothing is loaded until asked, so each load logs a line.
    agent = start_agent(repo, tmp_path, env={"EDGEPLEX_AGENT_MODEL_CONTROL_MODE": "explicit"})
    try:
        http = th.InferenceServerClient(agent.http_url)
        assert http.get_log_settings()["log_info"] is True  # no token needed to read
        with pytest.raises(InferenceServerException, match="401"):
            http.update_log_settings({"log_info": False})
        assert http.update_log_settings({"log_info": False}, headers=ADMIN)["log_info"] is False
        http.load_model("quiet", headers=ADMIN)  # its "loaded" line is INFO: not logged
        with tg.InferenceServerClient(agent.grpc_url) as grpc:
            read = grpc.get_log_settings(as_json=True)["settings"]
            assert read["log_info"] == {"bool_param": False}
            grpc.update_log_settings({"log_info": True}, headers=ADMIN)
            with pytest.raises(InferenceServerException, match="'log_file' is set when"):
                grpc.update_log_settings({"log_file": "elsewhere.log"}, headers=ADMIN)
        http.load_model("heard", headers=ADMIN)
        log = agent.log()
        assert "model heard:1 loaded" in log and "model quiet:1 loaded" not in log, log
        # Verbose: the runners log their DEBUG lines too (each load's stages).
        assert "heard:1 loaded from the" not in log
        http.update_log_settings({"log_verbose_level": 1}, headers=ADMIN)
        http.load_model("verbose", headers=ADMIN)
        assert "verbose:1 loaded from the cached tier on cpu" in agent.log()
        http.close()
    finally:
        assert agent.stop() == 0, agent.log()
