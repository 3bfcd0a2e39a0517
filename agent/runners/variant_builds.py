"""Quantized variants built in a runner, on its stager thread: each form of a
model converted and checked against the original (agent/runners/variants.py), with a
report per form. A form that cannot be built is reported with why, not raised."""

from __future__ import annotations

from pathlib import Path

from edgeplex.agent.catalog.forms import Calibration, VariantGuard, VariantReport
from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.sessions import scrub


def build_variants(request: ipc.BuildVariants) -> ipc.Message:
    try:
        from edgeplex.agent.runners import variants
    except ImportError as exc:
        message = f"variants need the onnx package (pip install edgeplex[variants]): {exc}"
        return ipc.Failure(request.req_id, "internal", message)
    calibration = Calibration.model_validate(request.calibration)
    guard = VariantGuard.model_validate(request.guard)
    reports = []
    sha256 = request.sha256  # the fleet's digest is one; a scan's may be size and mtime
    if len(sha256) != 64:
        sha256 = variants.sha256_of(Path(request.path))
    for form in request.forms:
        try:
            report = variants.build_variant(
                form, Path(request.path), sha256, Path(request.root), calibration, guard
            )
        except Exception as exc:  # a graph the tools cannot convert: kept out, with why
            reason = scrub(f"{type(exc).__name__}: {exc}", request.path, request.root)
            report = VariantReport(form=form, reason=f"build failed: {reason}")
        reports.append(report.model_dump())
    return ipc.VariantsBuilt(request.req_id, reports)
