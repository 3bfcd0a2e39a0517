"""The model-level files a fleet artifact brings: an archive that holds a Triton
model folder's files keeps them where Triton's layout has them.

    artifact (unpacked)            the repository
    model.onnx, weights files  ->  <repo>/<name>/<version>/  (links, reconcile.py)
    config.pbtxt               ->  <repo>/<name>/config.pbtxt
    labels its outputs name    ->  <repo>/<name>/<label file>
    warmup/, initial_state/    ->  <repo>/<name>/warmup/, initial_state/

So a model published to the fleet is served with its config.pbtxt (warm-up,
classification labels, sequence states, reshape, ...) as it would be from a
repository on disk. They are copied, not linked: the agent reads a config's
files as plain files inside the model's folder only (catalog/model_files.py).
What the fleet placed is listed in `.fleet-files`, so that the next artifact's
install removes what it no longer brings and nothing an operator put there.

Blocking file I/O: called from the reconciler's install thread.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from edgeplex.agent.catalog.model_files import plain_name
from edgeplex.agent.catalog.triton_config import PBTXT_FILE, parse_pbtxt
from edgeplex.durable import write_atomic

FOLDERS = ("warmup", "initial_state")  # Triton's model-level folders
PLACED = ".fleet-files"  # what the fleet put in the model's folder, one name a line


def model_level(artifact: Path) -> set[str]:
    """The top-level names of an unpacked artifact that belong in the model's folder,
    not its version's: none for an artifact that is one file."""
    if not artifact.is_dir():
        return set()
    names = {folder for folder in FOLDERS if (artifact / folder).is_dir()}
    config = artifact / PBTXT_FILE
    if config.is_file():
        names.add(PBTXT_FILE)
        names |= {name for name in _label_files(config) if (artifact / name).is_file()}
    return names


def place(artifact: Path, model_dir: Path) -> None:
    """Copy the artifact's model-level files into `model_dir`, and remove those an
    earlier artifact placed that this one does not bring."""
    names = model_level(artifact)
    model_dir.mkdir(parents=True, exist_ok=True)
    listed = model_dir / PLACED
    before = set(listed.read_text().split()) if listed.is_file() else set()
    for name in sorted(before - names):
        if plain_name(name):  # the list is a file in the repository: names, never paths
            _remove(model_dir / name)
    for name in sorted(names):
        source = artifact / name
        if source.is_dir():
            _copy_folder(source, model_dir / name)
        else:
            write_atomic(model_dir / name, source.read_bytes(), 0o644)
    if names or before:
        write_atomic(listed, "".join(f"{name}\n" for name in sorted(names)).encode(), 0o644)


def _label_files(config: Path) -> set[str]:
    """The label files a config's outputs name (plain names only: another is the
    model's error to report, when it is found)."""
    try:
        data = parse_pbtxt(config.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return set()  # the model fails with the parse error when it is found
    named = set()
    for output in data.get("output", []):
        if isinstance(output, dict):
            for name in output.get("label_filename", []):
                if isinstance(name, str) and plain_name(name):
                    named.add(name)
    return named


def _copy_folder(source: Path, target: Path) -> None:
    """`target` becomes a copy of `source` (its files and folders; an unpacked
    artifact holds no links)."""
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, symlinks=False)
    _remove(target)
    staging.rename(target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
