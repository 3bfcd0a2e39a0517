"""The model repository on disk, in Triton's layout.

    <repo>/<model>/config.yaml            optional, see config.ModelConfig
    <repo>/<model>/<version>/model.onnx   version: a positive integer

The highest version that has a model.onnx is served. Scanning is pure file
inspection: it never opens a model, so a broken file surfaces when its load
fails, not here. Model names are restricted so that no name can escape the
repository or break a URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeplex.agent.config import ModelConfig, load_model_config
from edgeplex.names import valid_name

MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class ModelSource:
    name: str
    version: str
    path: Path  # the model.onnx to load
    config: ModelConfig | None  # None when config.yaml is invalid (see config_error)
    config_error: str = ""
    # What the artifact is: its sha256 when the fleet installed it, else size and
    # mtime. Staged copies are keyed by it, so a replaced artifact is noticed.
    digest: str = ""


def scan_model(repo: Path, name: str, defaults: ModelConfig) -> ModelSource | None:
    """The servable version of one model, or None when there is none."""
    if not valid_name(name):
        return None
    model_dir = repo / name
    if not model_dir.is_dir():
        return None
    versions = sorted(
        (
            int(p.name)
            for p in model_dir.iterdir()
            if p.is_dir() and p.name.isdigit() and int(p.name) > 0 and (p / MODEL_FILE).is_file()
        ),
        reverse=True,
    )
    if not versions:
        return None
    version = str(versions[0])
    try:
        config: ModelConfig | None = load_model_config(model_dir / CONFIG_FILE, defaults)
        error = ""
    except Exception as exc:  # pydantic ValidationError, YAML errors
        config, error = None, f"invalid {CONFIG_FILE}: {_first_line(exc)}"
    path = model_dir / version / MODEL_FILE
    return ModelSource(name, version, path, config, error, artifact_digest(path))


def artifact_digest(path: Path) -> str:
    marker = path.parent / ".sha256"  # written by the fleet's reconciler
    if marker.is_file():
        return marker.read_text().strip()[:64]
    try:
        st = path.stat()
    except OSError:
        return ""
    return f"{st.st_size:x}-{st.st_mtime_ns:x}"


def scan_repository(repo: Path, defaults: ModelConfig) -> dict[str, ModelSource]:
    if not repo.is_dir():
        raise FileNotFoundError("the model repository does not exist or is not a directory")
    found = {}
    for entry in sorted(repo.iterdir()):
        source = scan_model(repo, entry.name, defaults)
        if source is not None:
            found[source.name] = source
    return found


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[:3])
