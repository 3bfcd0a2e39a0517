"""The model repository on disk, in Triton's layout.

    <repo>/<model>/config.pbtxt           optional, Triton's (triton_config.py)
    <repo>/<model>/config.yaml            optional, see config.ModelConfig; wins over
                                          config.pbtxt field by field
    <repo>/<model>/<version>/model.onnx   version: a positive integer

The highest version that has a model.onnx is served, or every version that
config.pbtxt's `version_policy` selects (requests without a version reach the
newest). Scanning is pure file
inspection: it never opens a model, so a broken file surfaces when its load
fails, not here. Model names are restricted so that no name can escape the
repository or break a URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeplex.agent.catalog.model_config import ModelConfig, load_model_config
from edgeplex.agent.catalog.triton_config import PBTXT_FILE, DeclaredTensor, read_triton_config
from edgeplex.names import valid_name, valid_version

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
    # From config.pbtxt: the interface it declares (checked against the graph)
    # and what it sets that edgeplex does not act on.
    declared_inputs: tuple[DeclaredTensor, ...] = ()
    declared_outputs: tuple[DeclaredTensor, ...] = ()
    warnings: tuple[str, ...] = ()


def scan_model(repo: Path, name: str, defaults: ModelConfig) -> ModelSource | None:
    """The newest servable version of one model, or None when there is none."""
    versions = scan_versions(repo, name, defaults)
    return versions[0] if versions else None


def scan_versions(repo: Path, name: str, defaults: ModelConfig) -> list[ModelSource]:
    """Every version of one model to serve, newest first ([] when there is none)."""
    if not valid_name(name):
        return []
    model_dir = repo / name
    if not model_dir.is_dir():
        return []
    versions = sorted(
        (
            int(p.name)
            for p in model_dir.iterdir()
            if valid_version(p.name) and p.is_dir() and (p / MODEL_FILE).is_file()
        ),
        reverse=True,
    )
    if not versions:
        return []
    triton, error, warnings = None, "", []
    if (model_dir / PBTXT_FILE).is_file():
        try:
            triton = read_triton_config(model_dir / PBTXT_FILE, name)
            warnings = triton.warnings
        except ValueError as exc:
            error = str(exc)
    chosen = triton.version_policy.select(versions) if triton else versions[:1]
    if triton and not chosen:
        error = f"{PBTXT_FILE}: version_policy selects none of the versions present ({versions})"
    config: ModelConfig | None = None
    if not error:
        try:
            base = triton.settings if triton else None
            config = load_model_config(model_dir / CONFIG_FILE, defaults, base)
        except Exception as exc:  # pydantic ValidationError, YAML errors
            error = (
                f"invalid {CONFIG_FILE if triton is None else 'model config'}: {_first_line(exc)}"
            )
    out = []
    for version in [str(v) for v in chosen] or [str(versions[0])]:
        path = model_dir / version / MODEL_FILE
        out.append(
            ModelSource(
                name,
                version,
                path,
                config,
                error,
                artifact_digest(path),
                declared_inputs=triton.inputs if triton else (),
                declared_outputs=triton.outputs if triton else (),
                warnings=tuple(warnings),
            )
        )
    return out


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
    """The newest version of every model."""
    return {
        name: versions[0] for name, versions in scan_repository_versions(repo, defaults).items()
    }


def scan_repository_versions(repo: Path, defaults: ModelConfig) -> dict[str, list[ModelSource]]:
    """Every version to serve of every model, newest first."""
    if not repo.is_dir():
        raise FileNotFoundError("the model repository does not exist or is not a directory")
    found = {}
    for entry in sorted(repo.iterdir()):
        versions = scan_versions(repo, entry.name, defaults)
        if versions:
            found[entry.name] = versions
    return found


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[:3])
