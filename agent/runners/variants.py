"""Quantized variants of a model: built once, checked against the original, stored by
content beside it.

Runs in a runner's background thread (never in the agent's event loop); needs the
`onnx` package (`pip install edgeplex[variants]`).

- `int8`: ONNX Runtime's quantization tools. Dynamic (weights INT8, activations
  quantized per batch) for graphs with MatMul or Gemm; static QDQ with the
  calibration set for convolutional graphs without them.
- `fp16`: ONNX Runtime's float16 converter, inputs and outputs kept in their
  original types. On the CPU it saves little (x86 kernels have no FP16 GEMM and
  ORT inserts casts); it pays off on the CUDA provider.

The accuracy guard runs the original and the variant on the calibration inputs
and records, per output: the largest absolute error, that error relative to the
largest magnitude of the original's output, the smallest per-sample cosine
similarity, and, where the output looks like class scores (floating point, last
dimension of two or more), top-1 agreement. A variant is usable only when every
output passes the model's thresholds.

Store layout (content-addressed): `<root>/<sha256>.onnx`, and
`<root>/index/<original sha256>-<form>-<calibration fingerprint>.json` naming
the file with its figures; a variant is built again only when its index or its
file is missing or the file's bytes no longer match. Thresholds are applied
anew on every request, so changing them needs no rebuild.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort

from edgeplex.agent.catalog.forms import Calibration, VariantGuard, VariantReport

_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


# --- calibration ------------------------------------------------------------------------


def calibration_inputs(
    session: ort.InferenceSession, calibration: Calibration, model_dir: Path
) -> list[dict[str, np.ndarray]]:
    """One feed per sample."""
    if calibration.file:
        return list(_from_file(session, calibration.file, model_dir))
    rng = np.random.default_rng(calibration.seed)
    feeds = []
    for _ in range(calibration.samples):
        feed: dict[str, np.ndarray] = {}
        for spec in session.get_inputs():
            dtype = _NUMPY.get(spec.type)
            if dtype is None:
                raise ValueError(
                    f"input '{spec.name}' is {spec.type}: give a calibration file for it"
                )
            shape = calibration.shapes.get(spec.name) or [
                d if isinstance(d, int) and d > 0 else 1 for d in spec.shape
            ]
            if np.issubdtype(dtype, np.floating):
                feed[spec.name] = rng.standard_normal(shape).astype(dtype)
            else:
                feed[spec.name] = np.zeros(shape, dtype)
        feeds.append(feed)
    return feeds


def _from_file(
    session: ort.InferenceSession, name: str, model_dir: Path
) -> Iterator[dict[str, np.ndarray]]:
    path = (model_dir / name).resolve()
    if not path.is_relative_to(model_dir.resolve()):
        raise ValueError(f"calibration file {name!r} is outside the model's directory")
    with np.load(path, allow_pickle=False) as data:
        arrays = {spec.name: data[spec.name] for spec in session.get_inputs()}
    # A 0-d array is the same for every sample (a sample rate, say).
    counts = {len(a) for a in arrays.values() if a.ndim} or {1}
    if len(counts) != 1:
        raise ValueError(f"calibration file {name!r}: inputs differ in sample count")
    for i in range(counts.pop()):
        yield {n: (a[i] if a.ndim else a) for n, a in arrays.items()}


# --- building ---------------------------------------------------------------------------


def _op_types(path: Path) -> Counter[str]:
    model = onnx.load(str(path), load_external_data=False)
    return Counter(node.op_type for node in model.graph.node)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _build_int8(src: Path, dst: Path, feeds: list[dict[str, np.ndarray]]) -> str:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ops = _op_types(src)
    if ops["MatMul"] + ops["Gemm"] >= ops["Conv"]:
        # Shape inference and graph optimisation first, as for static (below).
        # Written beside `dst`: given the original's path, the quantizer writes a
        # file beside it, in a repository a runner may only read.
        prepared = dst.with_name("prepared.onnx")
        quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(prepared, dst, weight_type=QuantType.QInt8)
        return "dynamic"

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

    # Shape inference and graph optimisation first (folded batch norms give the
    # quantizer initializers to work on), as ONNX Runtime's docs advise.
    # Per-channel QDQ needs opset 13: older graphs are converted first.
    prepared = dst.with_name("prepared.onnx")
    model = onnx.load(str(src))
    if _opset(model) < 13:
        model = onnx.version_converter.convert_version(model, 13)
    converted = dst.with_name("converted.onnx")
    onnx.save(model, str(converted))
    quant_pre_process(str(converted), str(prepared), skip_symbolic_shape=True)
    quantize_static(
        prepared,
        dst,
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return "static"


def _build_fp16(src: Path, dst: Path) -> str:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))
    return "float16"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build_variant(
    form: str,
    original: Path,
    original_sha: str,
    root: Path,
    calibration: Calibration,
    guard: VariantGuard,
) -> VariantReport:
    """The variant `form` of `original`, built or found in `root`, with its guard's
    figures. A variant that fails its thresholds is reported with the reason."""
    index = root / "index" / f"{original_sha}-{form}-{_fingerprint(calibration, original)}.json"
    known = _known(index, root)
    if known is not None:
        return _judge(known, guard, original.stat().st_size)
    started = time.perf_counter()
    ort.set_default_logger_severity(3)  # the quantizer's sessions warn about every constant
    session = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    feeds = calibration_inputs(session, calibration, original.parent.parent)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as work:
        built = Path(work) / "variant.onnx"
        try:
            if form == "int8":
                method = _build_int8(original, built, feeds)
            else:
                method = _build_fp16(original, built)
            variant = ort.InferenceSession(str(built), providers=["CPUExecutionProvider"])
        except Exception as exc:  # a graph the tools cannot convert: kept out, with why
            message = str(exc).replace(str(work), "<work>").replace(str(original), "<model>")
            reason = f"build failed: {type(exc).__name__}: {message[:300]}"
            return VariantReport(form=form, reason=reason)
        digest = sha256_of(built)
        final = root / f"{digest}.onnx"
        os.replace(built, final)
    report = VariantReport(
        form=form,
        path=str(final),
        sha256=digest,
        file_bytes=final.stat().st_size,
        method=method,
        samples=len(feeds),
        outputs=compare(session, variant, feeds),
        build_ms=(time.perf_counter() - started) * 1000,
    )
    index.parent.mkdir(parents=True, exist_ok=True)
    partial = index.with_suffix(".tmp")
    partial.write_text(report.model_dump_json())
    os.replace(partial, index)
    return _judge(report, guard, original.stat().st_size)


def _fingerprint(calibration: Calibration, original: Path) -> str:
    """What the figures depend on besides the original: the calibration settings, and
    the calibration file's bytes."""
    digest = hashlib.sha256(calibration.model_dump_json().encode())
    if calibration.file:
        with contextlib.suppress(OSError):
            digest.update(sha256_of(original.parent.parent / calibration.file).encode())
    return digest.hexdigest()[:16]


def _known(index: Path, root: Path) -> VariantReport | None:
    try:
        report = VariantReport.model_validate_json(index.read_text())
    except (OSError, ValueError):
        return None
    path = root / f"{report.sha256}.onnx"
    if not path.is_file() or sha256_of(path) != report.sha256:
        return None
    report.path = str(path)
    report.build_ms = 0.0  # found, not built
    return report


def _judge(report: VariantReport, guard: VariantGuard, original_bytes: int) -> VariantReport:
    failures = []
    if report.file_bytes >= original_bytes:
        failures.append(f"saves no bytes ({report.file_bytes} >= {original_bytes})")
    for name, figures in report.outputs.items():
        if figures["cosine"] < guard.min_cosine:
            failures.append(f"{name}: cosine {figures['cosine']:.5f} < {guard.min_cosine}")
        top1 = figures.get("top1_agreement")
        if top1 is not None and top1 < guard.min_top1_agreement:
            failures.append(f"{name}: top-1 agreement {top1:.3f} < {guard.min_top1_agreement}")
        if guard.max_abs_error is not None and figures["max_abs_error"] > guard.max_abs_error:
            failures.append(
                f"{name}: max abs error {figures['max_abs_error']:.3g} > {guard.max_abs_error}"
            )
        if guard.max_rel_error is not None and figures["max_rel_error"] > guard.max_rel_error:
            failures.append(
                f"{name}: max rel error {figures['max_rel_error']:.3g} > {guard.max_rel_error}"
            )
    report.usable = not failures
    report.reason = "; ".join(failures)
    return report


# --- the guard's figures ------------------------------------------------------------------


def compare(
    original: ort.InferenceSession,
    variant: ort.InferenceSession,
    feeds: list[dict[str, np.ndarray]],
) -> dict[str, dict[str, float]]:
    """Per output: max_abs_error, max_rel_error, cosine (the smallest over samples)
    and, for class scores, top1_agreement."""
    names = [o.name for o in original.get_outputs()]
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in names}
    for feed in feeds:
        expected = original.run(names, feed)
        got = variant.run(names, feed)
        for name, a, b in zip(names, expected, got, strict=True):
            pairs[name].append((np.asarray(a), np.asarray(b)))
    return {name: output_figures(pairs[name]) for name in names}


def output_figures(pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    ref = np.concatenate([a.astype(np.float64).ravel() for a, _ in pairs])
    got = np.concatenate([b.astype(np.float64).ravel() for _, b in pairs])
    diff = np.abs(ref - got)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    figures: dict[str, float] = {
        "max_abs_error": max_abs,
        "max_rel_error": max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else 1.0),
        "cosine": min(_cosine(a, b) for a, b in pairs),
    }
    first = pairs[0][0]
    if np.issubdtype(first.dtype, np.floating) and first.ndim >= 2 and first.shape[-1] >= 2:
        agree = [np.argmax(a, axis=-1) == np.argmax(b, axis=-1) for a, b in pairs]
        figures["top1_agreement"] = float(np.mean(np.concatenate([x.ravel() for x in agree])))
    return figures


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))
