"""A model's forms: the one it ships as, and the quantized variants edgeplex may build
of it (agent/runners/variants.py builds them; residency chooses among them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edgeplex.names import VARIANT_FORMS

Form = Literal["int8", "fp16"]
FORMS = VARIANT_FORMS
ORIGINAL = ""  # the form of the model as shipped


class VariantGuard(BaseModel):
    """Thresholds a variant must meet on every output to be served."""

    model_config = ConfigDict(extra="forbid")

    min_cosine: float = Field(
        default=0.999, ge=-1, le=1, description="Smallest per-sample cosine similarity."
    )
    min_top1_agreement: float = Field(
        default=0.99,
        ge=0,
        le=1,
        description="Share of samples whose top-1 class agrees, for outputs that look like "
        "class scores.",
    )
    max_abs_error: float | None = Field(
        default=None, gt=0, description="Largest absolute error allowed. Unset: not checked."
    )
    max_rel_error: float | None = Field(
        default=0.05,
        gt=0,
        description="Largest absolute error relative to the largest magnitude of the "
        "original's output. Unset: not checked.",
    )


class Calibration(BaseModel):
    """The inputs variants are built and checked with."""

    model_config = ConfigDict(extra="forbid")

    file: str | None = Field(
        default=None,
        description="An .npz file in the model's directory with one array per input, "
        "samples along the first axis (read without pickle). Unset: inputs generated from "
        "the input spec with `seed` (floats standard normal, integers 0).",
    )
    samples: int = Field(default=32, ge=1, le=4096, description="Generated samples.")
    shapes: dict[str, list[int]] = Field(
        default={},
        description="Shape of each generated sample per input name (batch dimension "
        "included). Unset: the input's static dimensions, 1 for dynamic ones.",
    )
    seed: int = Field(default=0, description="Seed of the generated samples.")


class VariantReport(BaseModel):
    """One built variant, as the runner reports it and the status shows it."""

    form: str
    path: str = ""
    sha256: str = ""
    file_bytes: int = 0
    usable: bool = False
    reason: str = ""
    method: str = ""
    build_ms: float = 0.0
    samples: int = 0
    outputs: dict[str, dict[str, float]] = {}


def guard_summary(report: VariantReport) -> str:
    """One line for load reports: the worst figures over its outputs, or why it is out."""
    if not report.usable:
        return f"kept out: {report.reason}"
    outputs = report.outputs.values()
    line = f"usable: cosine {min(f['cosine'] for f in outputs):.5f}"
    top1 = [f["top1_agreement"] for f in outputs if "top1_agreement" in f]
    if top1:
        line += f", top-1 {min(top1):.3f}"
    return line + f", rel error {max(f['max_rel_error'] for f in outputs):.3g}"


def report_dict(report: VariantReport) -> dict[str, Any]:
    """What status pages show: the figures rounded, the store path left out."""
    data = report.model_dump(exclude={"path"})
    data["outputs"] = {n: {k: round(v, 6) for k, v in f.items()} for n, f in report.outputs.items()}
    data["build_ms"] = round(report.build_ms, 1)
    return data
