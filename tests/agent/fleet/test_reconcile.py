"""The agent's desired-state handling that needs no process: stale versions."""

from __future__ import annotations

from pathlib import Path

from edgeplex.agent.catalog.model_config import ModelConfig, load_model_config
from edgeplex.agent.fleet.reconcile import Reconciler
from edgeplex.artifacts import ANYWHERE, ArtifactCache
from edgeplex.proto import edgeplex_control_pb2 as pb


def test_only_newer_versions_are_queued(tmp_path: Path) -> None:
    r = Reconciler(
        agent=None, repo=tmp_path, artifacts=ArtifactCache(tmp_path / "c", 1 << 20, ANYWHERE)
    )  # type: ignore[arg-type]
    assert r.offer(pb.DesiredState(version=5, site_id="s"))
    assert not r.offer(pb.DesiredState(version=5, site_id="s"))  # the same, seen again
    assert not r.offer(pb.DesiredState(version=3, site_id="s"))  # from a deposed leader
    assert r.offer(pb.DesiredState(version=6, site_id="s"))  # newest pending wins
    r.applied_version = 9
    assert not r.offer(pb.DesiredState(version=8, site_id="s"))


def test_the_catalogs_variants_reach_the_models_config(tmp_path: Path) -> None:
    r = Reconciler(
        agent=None, repo=tmp_path, artifacts=ArtifactCache(tmp_path / "c", 1 << 20, ANYWHERE)
    )  # type: ignore[arg-type]
    (tmp_path / "m").mkdir()
    r._write_config(pb.DesiredModel(name="m", variants=["int8"], quality="any"))
    config = load_model_config(tmp_path / "m" / "config.yaml", ModelConfig())
    assert config.variants == ["int8"] and config.quality == "any"
    r._write_config(pb.DesiredModel(name="plain"))  # declares neither: nothing written
    assert not (tmp_path / "plain" / "config.yaml").exists()
