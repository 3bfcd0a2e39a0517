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

import hashlib
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgeplex.agent.catalog.model_config import ModelConfig, load_model_config
from edgeplex.agent.catalog.sequence_config import SequenceSpec
from edgeplex.agent.catalog.triton_config import (
    MODEL_FILE,
    PBTXT_FILE,
    SUPPORTED_BACKENDS,
    SUPPORTED_PLATFORMS,
    DeclaredTensor,
    Message,
    model_file,
    parse_pbtxt,
    read_triton_config,
    triton_config,
)
from edgeplex.agent.catalog.warmup import WarmupSample
from edgeplex.names import valid_name, valid_version

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
    sequence: SequenceSpec | None = None  # config.pbtxt's sequence_batching
    warmup: tuple[WarmupSample, ...] = ()  # config.pbtxt's model_warmup
    # config.pbtxt's onnxruntime parameters passed to ONNX Runtime (key, value).
    ort_parameters: tuple[tuple[str, str], ...] = ()
    # Every file of the model's folder as it was read (folder_stamp): in poll mode a
    # model reloads when any of them changes, its graph, config, labels, initial
    # states or warm-up data, as Triton's poll does.
    stamp: str = ""


@dataclass(frozen=True)
class RepositoryRead:
    """One read of the repository: every servable model's versions, newest first,
    and the model folders that hold nothing to serve, with why."""

    found: dict[str, list[ModelSource]]
    unservable: dict[str, str]


def scan_model(repo: Path, name: str, defaults: ModelConfig) -> ModelSource | None:
    """The newest servable version of one model, or None when there is none."""
    versions = scan_versions(repo, name, defaults)
    return versions[0] if versions else None


def scan_versions(
    repo: Path,
    name: str,
    defaults: ModelConfig,
    gpu: bool = False,
    override: Message | None = None,
    stamp: str | None = None,
) -> list[ModelSource]:
    """Every version of one model to serve, newest first ([] when there is none).
    `gpu`: whether the runners have a GPU (KIND_GPU needs one); `override`: a model
    config that replaces config.pbtxt (a load's `config` parameter); `stamp`: the
    folder's, when the caller took it already."""
    if not valid_name(name):
        return []
    model_dir = repo / name
    if not model_dir.is_dir():
        return []
    if stamp is None:  # taken before reading: a change meanwhile shows next time
        stamp = folder_stamp(model_dir)
    triton, error, warnings = None, "", []
    try:
        if override is not None:
            triton = triton_config(override, name, model_dir)
        elif (model_dir / PBTXT_FILE).is_file():
            triton = read_triton_config(model_dir / PBTXT_FILE, name)
        warnings = triton.warnings if triton else []
    except ValueError as exc:
        error = str(exc)
    graph = triton.model_file if triton else _model_file(model_dir)
    versions = _versions(model_dir, graph)
    if not versions:
        return []
    if triton and "KIND_GPU" in triton.kinds and not gpu:
        error = (
            f"{PBTXT_FILE}: instance_group kind KIND_GPU needs a GPU, and this agent's runners "
            "use the CPU (runner.execution_provider: cpu)"
        )
    elif triton and "KIND_CPU" in triton.kinds and gpu:
        warnings.append(
            f"{PBTXT_FILE}: instance_group kind KIND_CPU: served on the GPU, as every model of "
            "this agent (runner.execution_provider: cuda)"
        )
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
        path = model_dir / version / graph
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
                sequence=triton.sequence if triton else None,
                warmup=triton.warmup if triton else (),
                ort_parameters=tuple(sorted(triton.ort_parameters.items())) if triton else (),
                stamp=stamp,
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


def scan_repository_versions(
    repo: Path,
    defaults: ModelConfig,
    gpu: bool = False,
    last: Mapping[str, list[ModelSource]] | None = None,
) -> dict[str, list[ModelSource]]:
    """Every version to serve of every model, newest first. A model in `last` (the
    previous scan) whose folder's stamp is unchanged is taken from it, not read again:
    poll mode rescans a catalog of thousands every few seconds."""
    if not repo.is_dir():
        raise FileNotFoundError("the model repository does not exist or is not a directory")
    found = {}
    for entry in sorted(repo.iterdir()):
        if not valid_name(entry.name) or not entry.is_dir():
            continue  # not a model's folder (.artifacts, .variants): never walked
        stamp = folder_stamp(entry)
        before = (last or {}).get(entry.name)
        if before and before[0].stamp == stamp:
            found[entry.name] = before
        elif versions := scan_versions(repo, entry.name, defaults, gpu, stamp=stamp):
            found[entry.name] = versions
    return found


def folder_stamp(model_dir: Path) -> str:
    """A digest of what a model's folder holds: the path, size, modification time and
    inode of every file under it (links followed, each folder once). A stat a file,
    nothing read; an edit that keeps all four within the file system's clock tick
    goes unseen, as in Triton's poll."""
    digest = hashlib.blake2b(digest_size=16)
    seen: set[tuple[int, int]] = set()
    for folder, subfolders, files in os.walk(model_dir, followlinks=True):
        try:
            info = os.stat(folder)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in seen:  # a link back up the tree
            subfolders.clear()
            continue
        seen.add((info.st_dev, info.st_ino))
        subfolders.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            try:
                info = os.stat(path)
            except OSError:  # gone meanwhile, or a dangling link
                continue
            where = os.path.relpath(path, model_dir)
            digest.update(f"{where}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ino}\n".encode())
    return digest.hexdigest()


def unservable(repo: Path, served: Collection[str] = ()) -> dict[str, str]:
    """The repository's model folders that hold nothing edgeplex can serve, and why
    (Triton lists them too; they must not vanish without a word). `served`: the
    models a scan found versions of."""
    found = {}
    for entry in sorted(repo.iterdir()):
        if entry.name in served or not valid_name(entry.name) or not entry.is_dir():
            continue
        if _versions(entry, _model_file(entry)):
            continue
        found[entry.name] = _why_unservable(entry)
    return found


def _versions(model_dir: Path, graph: str) -> list[int]:
    """The version folders that hold the graph file `graph`, newest first."""
    return sorted(
        (
            int(p.name)
            for p in model_dir.iterdir()
            if valid_version(p.name) and p.is_dir() and (p / graph).is_file()
        ),
        reverse=True,
    )


def _config_of(model_dir: Path) -> Message:
    """The model's config.pbtxt as parsed, or nothing when it cannot be read."""
    try:
        return parse_pbtxt((model_dir / PBTXT_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}


def _model_file(model_dir: Path) -> str:
    """The graph's file name as the model's config.pbtxt says (model.onnx by default,
    and when the config cannot be read: it fails the model then, with the reason)."""
    try:
        return model_file(_config_of(model_dir))
    except ValueError:
        return MODEL_FILE


def _why_unservable(model_dir: Path) -> str:
    data = _config_of(model_dir)
    platform = (data.get("platform") or data.get("backend") or [""])[-1]
    if platform and platform not in (*SUPPORTED_PLATFORMS, *SUPPORTED_BACKENDS):
        return f"platform '{platform}' is not supported: edgeplex serves ONNX models"
    graph = _model_file(model_dir)
    return f"no version folder holds a {graph} (<version>/{graph})"


def invalid_file(files: dict[str, bytes]) -> str | None:
    """The first of a load's `files` (Triton's "file:<path>" parameters) whose path
    could not be a file of the model, or None."""
    for key in files:
        path = key.removeprefix("file:")
        parts = path.split("/")
        if (
            not key.startswith("file:")
            or not path
            or path.startswith("/")
            or any(part in ("", ".", "..") or len(part.encode()) > 255 for part in parts)
        ):
            return key
    return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[:3])
