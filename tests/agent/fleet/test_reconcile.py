"""The agent's desired-state handling that needs no process: stale versions, the
catalog's options, and what an archive installs where."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.model_config import ModelConfig, load_model_config
from edgeplex.agent.catalog.repository import scan_model
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


def _archive(tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A .tar.gz artifact holding `files` (path: bytes): its URI and sha256."""
    path = tmp_path / f"model-{len(list(tmp_path.glob('model-*')))}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_archive_brings_its_triton_model_folder(tmp_path: Path) -> None:
    """config.pbtxt, the labels it names, warmup/ and initial_state/ go beside the
    versions, as Triton's layout has them; the model is then served with them, and
    the next artifact takes away what it no longer brings."""
    demo.make_add_sub(tmp_path / "built" / "m")
    graph = (tmp_path / "built" / "m" / "1" / "model.onnx").read_bytes()
    config = (
        'max_batch_size: 8\noutput [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ], '
        'label_filename: "labels.txt" } ]\n'
        'model_warmup [ { name: "w" batch_size: 1 inputs [\n'
        '  { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "a" } },\n'
        '  { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } ] } ]\n'
    )
    uri, digest = _archive(tmp_path, {
        "model.onnx": graph,
        "config.pbtxt": config.encode(),
        "labels.txt": "".join(f"c{i}\n" for i in range(16)).encode(),
        "warmup/a": bytes(64),
        "notes.txt": b"not named: a file of the version",
    })  # fmt: skip
    repo = tmp_path / "repo"
    r = Reconciler(
        agent=None, repo=repo, artifacts=ArtifactCache(tmp_path / "c", 1 << 22, ANYWHERE)
    )  # type: ignore[arg-type]
    r.install(pb.DesiredModel(name="m", version="1", artifact_uri=uri, sha256=digest))
    model = repo / "m"
    assert sorted(p.name for p in model.iterdir()) == [
        ".fleet-files", "1", "config.pbtxt", "labels.txt", "warmup",
    ]  # fmt: skip
    assert sorted(p.name for p in (model / "1").iterdir()) == [".sha256", "model.onnx", "notes.txt"]
    source = scan_model(repo, "m", ModelConfig())
    assert source is not None and not source.config_error, source
    assert source.declared_outputs[0].labels[15] == "c15"
    assert [s.name for s in source.warmup] == ["w"]

    (model / "operator.txt").write_text("an operator's: left alone")
    uri, digest = _archive(tmp_path, {"model.onnx": graph})  # a bare graph now
    r.install(pb.DesiredModel(name="m", version="2", artifact_uri=uri, sha256=digest))
    assert sorted(p.name for p in model.iterdir()) == [".fleet-files", "1", "2", "operator.txt"]
