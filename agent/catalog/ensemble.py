"""Triton's ensembles: a model folder whose config.pbtxt says `platform: "ensemble"`
and whose `ensemble_scheduling` chains other models of the repository, each step
mapping ensemble tensors to its inputs (`input_map`: step input -> ensemble
tensor) and its outputs to ensemble tensors (`output_map`: step output ->
ensemble tensor).

This module reads and checks one (pure); the core runs it: each step is a request
to its model as any other, with the model's own residency, batching and limits,
all under the ensemble request's one deadline. Steps whose inputs are ready run
together (`waves`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeplex.agent.catalog.triton_config import (
    PBTXT_FILE,
    DeclaredTensor,
    Message,
    PbtxtError,
    parse_pbtxt,
    response_cache,
    triton_tensor,
)
from edgeplex.agent.oip.tensors import triton_type

ENSEMBLE = "ensemble"


@dataclass(frozen=True)
class Step:
    model: str
    version: str  # "" for the newest (Triton's -1)
    inputs: dict[str, str]  # the step model's input -> the ensemble tensor it reads
    outputs: dict[str, str]  # the step model's output -> the ensemble tensor it makes


@dataclass(frozen=True)
class Ensemble:
    name: str
    version: str
    max_batch_size: int
    inputs: tuple[DeclaredTensor, ...]
    outputs: tuple[DeclaredTensor, ...]
    waves: tuple[tuple[Step, ...], ...]  # steps in the order they can run, together
    response_cache: bool = False  # its answers kept whole (Triton's top-level caching)
    warnings: tuple[str, ...] = ()  # what its config sets that edgeplex does not act on

    def tensor_json(self, tensor: DeclaredTensor) -> dict[str, object]:
        """A tensor as model metadata lists it (with the batch dimension, if any)."""
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": batch + list(tensor.dims),
        }

    @property
    def models(self) -> list[str]:
        return sorted({step.model for wave in self.waves for step in wave})

    def config_json(self) -> dict[str, object]:
        """As Triton's model config endpoint returns an ensemble's (JSON)."""

        def tensors(specs: tuple[DeclaredTensor, ...]) -> list[dict[str, object]]:
            return [{"name": t.name, "data_type": triton_type(t.datatype), "dims": list(t.dims),
                     **({"label_filename": t.label_file} if t.label_file else {})}
                    for t in specs]  # fmt: skip

        steps = [
            {"model_name": s.model, "model_version": int(s.version or -1),
             "input_map": dict(s.inputs), "output_map": dict(s.outputs)}
            for wave in self.waves for s in wave
        ]  # fmt: skip
        return {
            "name": self.name,
            "platform": ENSEMBLE,
            "max_batch_size": self.max_batch_size,
            "input": tensors(self.inputs),
            "output": tensors(self.outputs),
            "ensemble_scheduling": {"step": steps},
        }


def is_ensemble(model_dir: Path) -> bool:
    """Whether config.pbtxt declares `platform: "ensemble"` (read cheaply first)."""
    path = model_dir / PBTXT_FILE
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    return ENSEMBLE in text and _platform(text) == ENSEMBLE


def _platform(text: str) -> str:
    try:
        return str((parse_pbtxt(text).get("platform") or [""])[-1])
    except PbtxtError:
        return ""


def read_ensemble(model_dir: Path, known: set[str]) -> Ensemble:
    """The ensemble of `model_dir`; ValueError naming what is wrong (a tensor no one
    makes, a step model the repository lacks, a cycle)."""
    name = model_dir.name
    try:
        data = parse_pbtxt((model_dir / PBTXT_FILE).read_text())
    except (OSError, UnicodeDecodeError, PbtxtError) as exc:
        raise ValueError(f"{PBTXT_FILE}: {exc}") from None
    declared = str((data.get("name") or [name])[-1])
    if declared != name:
        raise ValueError(f"{PBTXT_FILE}: name {declared!r} does not match the directory {name!r}")
    warnings: list[str] = []
    inputs = tuple(triton_tensor(t, "input", warnings) for t in data.get("input", []))
    outputs = tuple(triton_tensor(t, "output", warnings, model_dir) for t in data.get("output", []))
    warnings += [
        f"{PBTXT_FILE}: input '{t.name}': optional is not supported for an ensemble; required"
        for t in inputs
        if t.optional
    ]
    if not inputs or not outputs:
        raise ValueError(f"{PBTXT_FILE}: an ensemble declares its inputs and outputs")
    steps = _steps(data, known)
    waves = _waves(steps, {t.name for t in inputs}, {t.name for t in outputs})
    max_batch = int((data.get("max_batch_size") or [0])[-1])
    # Its newest version folder (empty, as Triton has them); "1" where it has none.
    numbered = [int(p.name) for p in model_dir.iterdir() if p.name.isascii() and p.name.isdigit()]
    version = str(max(numbered)) if numbered else "1"
    return Ensemble(
        name, version, max_batch, inputs, outputs, waves, response_cache(data), tuple(warnings)
    )


def nesting_errors(ensembles: dict[str, Ensemble], max_depth: int) -> dict[str, str]:
    """Ensembles whose steps lead back to themselves, or nest deeper than
    `max_depth`, with why: they cannot run (pure)."""
    errors = {}

    def depth(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise ValueError(f"its steps lead back to it ({' -> '.join((*path, name))})")
        inner = [m for m in ensembles[name].models if m in ensembles]
        return 1 + max((depth(m, (*path, name)) for m in inner), default=0)

    for name in ensembles:
        try:
            if depth(name, ()) > max_depth:
                errors[name] = f"ensembles nest more than {max_depth} deep"
        except ValueError as exc:
            errors[name] = str(exc)
    return errors


def _steps(data: Message, known: set[str]) -> list[Step]:
    blocks = data.get("ensemble_scheduling") or []
    raw_steps = [s for block in blocks for s in block.get("step", [])]
    if not raw_steps:
        raise ValueError(f"{PBTXT_FILE}: ensemble_scheduling has no step")
    steps = []
    for raw in raw_steps:
        model = str((raw.get("model_name") or [""])[-1])
        version = int((raw.get("model_version") or [-1])[-1])
        if model not in known:
            raise ValueError(f"ensemble step model '{model}' is not in the repository")
        steps.append(Step(
            model,
            "" if version < 0 else str(version),
            {str(m["key"][0]): str(m["value"][0]) for m in raw.get("input_map", [])},
            {str(m["key"][0]): str(m["value"][0]) for m in raw.get("output_map", [])},
        ))  # fmt: skip
    return steps


def _waves(steps: list[Step], given: set[str], wanted: set[str]) -> tuple[tuple[Step, ...], ...]:
    """Steps grouped by when their inputs exist: the first wave reads only the
    ensemble's inputs, each next one also what the waves before made."""
    made: dict[str, str] = {}
    for step in steps:
        for tensor in step.outputs.values():
            if tensor in made or tensor in given:
                raise ValueError(f"ensemble tensor '{tensor}' is made twice")
            made[tensor] = step.model
    available, left, waves = set(given), list(steps), []
    while left:
        wave = tuple(s for s in left if set(s.inputs.values()) <= available)
        if not wave:
            missing = sorted({t for s in left for t in s.inputs.values()} - available - set(made))
            if missing:
                raise ValueError(f"ensemble tensor '{missing[0]}' is read but no step makes it")
            raise ValueError("the ensemble's steps form a cycle")
        waves.append(wave)
        left = [s for s in left if s not in wave]
        available |= {t for s in wave for t in s.outputs.values()}
    for tensor in sorted(wanted - available):
        raise ValueError(f"ensemble output '{tensor}' is made by no step")
    return tuple(waves)
