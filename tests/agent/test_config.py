"""Configuration: typed, documented field by field, and the example matches."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from edgeplex.agent.config import (
    AgentSettings,
    FleetSettings,
    ModelConfig,
    RunnerSettings,
    load_model_config,
    load_settings,
    parse_size,
    reference_tables,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_field_has_a_description():
    for cls in (AgentSettings, RunnerSettings, ModelConfig):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"


def test_configuration_doc_is_current():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert reference_tables().strip() in doc, "regenerate docs/configuration.md's reference"


def test_example_config_sets_every_option_to_its_default():
    path = ROOT / "deploy" / "agent.example.yaml"
    data = yaml.safe_load(path.read_text())
    assert set(data) == set(AgentSettings.model_fields)
    assert set(data["runner"]) == set(RunnerSettings.model_fields)
    assert set(data["fleet"]) == set(FleetSettings.model_fields)
    assert set(data["model_defaults"]) == set(ModelConfig.model_fields)
    assert load_settings(path) == AgentSettings()


def test_precedence_flags_over_env_over_file(tmp_path, monkeypatch):
    path = tmp_path / "agent.yaml"
    path.write_text("http_port: 9000\ngrpc_port: 9001\nrunner: {intra_op_threads: 2}\n")
    monkeypatch.setenv("EDGEPLEX_AGENT_HTTP_PORT", "9100")
    monkeypatch.setenv("EDGEPLEX_AGENT_RUNNER__INTER_OP_THREADS", "3")
    settings = load_settings(path, grpc_port=7000, http_host=None)
    assert settings.grpc_port == 7000 and settings.http_port == 9100
    assert settings.runner.intra_op_threads == 2 and settings.runner.inter_op_threads == 3


def test_unknown_keys_and_bad_values_are_errors(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("grpc_prot: 1\n")
    with pytest.raises(ValidationError):
        load_settings(path)
    model = tmp_path / "config.yaml"
    model.write_text("isolation: separate\n")
    with pytest.raises(ValidationError):
        load_model_config(model, ModelConfig())


def test_rate_limiting_read_as_written(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("rate_limit: off\n")  # YAML reads an unquoted off as false
    assert load_settings(path).rate_limit == "off"
    path.write_text("rate_limit: execution_count\nrate_limit_resources: {gpu_slots: 2}\n")
    settings = load_settings(path)
    assert settings.rate_limit == "execution_count"
    assert settings.rate_limit_resources == {"gpu_slots": 2}
    path.write_text("rate_limit: on\n")
    with pytest.raises(ValidationError):
        load_settings(path)
    path.write_text("rate_limit_resources: {gpu_slots: 0}\n")
    with pytest.raises(ValidationError, match="gpu_slots': count 0 is below 1"):
        load_settings(path)


def test_sizes():
    assert parse_size("64MiB") == 64 * 2**20
    assert parse_size("2G") == 2 * 2**30
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError):
        parse_size("lots")


def test_control_plane_example_config_sets_every_option_to_its_default(monkeypatch):
    from edgeplex.control_plane.config import ControlPlaneSettings
    from edgeplex.control_plane.config import load_settings as load_cp_settings
    from edgeplex.control_plane.config import reference_tables as cp_tables

    monkeypatch.delenv("EDGEPLEX_ADMIN_TOKEN", raising=False)
    path = ROOT / "deploy" / "control-plane.example.yaml"
    data = yaml.safe_load(path.read_text())
    assert set(data) == set(ControlPlaneSettings.model_fields)
    loaded = load_cp_settings(path)
    assert loaded.model_dump(exclude={"replica_id"}) == ControlPlaneSettings().model_dump(
        exclude={"replica_id"}
    )
    assert cp_tables().strip() in (ROOT / "docs" / "configuration.md").read_text()
