"""Quantized variants: built and checked (against direct ONNX Runtime), kept out when
they fail their guard, chosen under memory pressure by models that accept them,
named in every response they serve, and swapped back when room returns."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.forms import Calibration, VariantGuard
from edgeplex.agent.runners.variants import build_variant, output_figures, sha256_of
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import AUTH, CACHE, start_agent
from tests.support.agent import infer_http, status

MiB = 1 << 20
ANY = "variants: [int8, fp16]\nquality: any\nvariant_guard: {min_top1_agreement: 0.9}\n"


def _figures_by_hand(original: Path, variant: Path, feeds: list[dict]) -> dict[str, dict]:
    a = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(variant), providers=["CPUExecutionProvider"])
    names = [o.name for o in a.get_outputs()]
    pairs: dict[str, list] = {n: [] for n in names}
    for feed in feeds:
        for name, x, y in zip(names, a.run(names, feed), b.run(names, feed), strict=True):
            pairs[name].append((x, y))
    return {n: output_figures(p) for n, p in pairs.items()}


def _check_against_direct_ort(report, original: Path, feeds: list[dict]) -> None:
    expected = _figures_by_hand(original, Path(report.path), feeds)
    assert report.outputs.keys() == expected.keys()
    for name, figures in expected.items():
        for key, value in figures.items():
            assert report.outputs[name][key] == pytest.approx(value, rel=1e-6, abs=1e-9)
    # And by hand, once more, from first principles for the first output.
    name = next(iter(expected))
    a = ort.InferenceSession(str(original)).run([name], feeds[0])[0].ravel()
    b = ort.InferenceSession(report.path).run([name], feeds[0])[0].ravel()
    cosine = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert report.outputs[name]["cosine"] <= cosine + 1e-9  # the smallest over samples


def test_variants_of_a_generated_mlp_are_built_checked_and_stored_by_content(tmp_path):
    original = demo.make_mlp(tmp_path / "repo" / "mlp", width=512, layers=4, seed=3, in_width=64)
    store = tmp_path / "store"
    calibration = Calibration(samples=16, seed=7)
    guard = VariantGuard(min_top1_agreement=0.9)
    rng = np.random.default_rng(7)
    feeds = [{"input": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(16)]
    int8 = build_variant("int8", original, sha256_of(original), store, calibration, guard)
    assert int8.usable, int8.reason
    assert int8.method == "dynamic" and int8.file_bytes < 0.3 * original.stat().st_size
    assert Path(int8.path).name == f"{sha256_of(Path(int8.path))}.onnx"  # content-addressed
    _check_against_direct_ort(int8, original, feeds)
    fp16 = build_variant("fp16", original, sha256_of(original), store, calibration, guard)
    assert fp16.usable and fp16.file_bytes < 0.55 * original.stat().st_size
    assert ort.InferenceSession(fp16.path).get_inputs()[0].type == "tensor(float)"  # io kept
    _check_against_direct_ort(fp16, original, feeds)
    # Built once: asked again, it is found (no build time), with the same figures.
    again = build_variant("int8", original, sha256_of(original), store, calibration, guard)
    assert again.build_ms == 0 and again.sha256 == int8.sha256 and again.outputs == int8.outputs
    # Stricter thresholds apply without a rebuild, and name what failed.
    strict = VariantGuard(max_abs_error=1e-9)
    kept_out = build_variant("int8", original, sha256_of(original), store, calibration, strict)
    assert not kept_out.usable and "max abs error" in kept_out.reason


def _text_lines(count: int) -> np.ndarray:
    """Images the classifier was made for, roughly: dark glyph-like strokes on a white
    line, normalised to [-1, 1] as PP-OCR does; every other one upside down."""
    rng = np.random.default_rng(0)
    images = np.ones((count, 1, 3, 48, 192), np.float32)
    for i in range(count):
        x = 4
        while x < 180:
            w, h = rng.integers(4, 14), rng.integers(16, 30)
            y = rng.integers(8, max(9, 44 - h))
            images[i, 0, :, y : y + h, x : x + w] = -1 + 0.2 * rng.random()
            x += w + rng.integers(2, 8)
        if i % 2:
            images[i, 0] = images[i, 0, :, ::-1, ::-1]
    return images


def test_variants_of_a_packaged_model_are_checked_and_a_bad_one_is_kept_out(tmp_path):
    """PP-OCR's text-direction classifier (from rapidocr-onnxruntime): its FP16 copy
    passes the strict default guard; its static INT8 copy (a convolutional graph)
    drifts too far from the original's scores, and the guard keeps it out."""
    original = demo.fetch_ppocr_cls(tmp_path / "repo" / "ocr_cls", cache=CACHE)
    images = _text_lines(64)
    np.savez(original.parent.parent / "calibration.npz", x=images)
    calibration = Calibration(file="calibration.npz")
    feeds = [{"x": image} for image in images]
    store = tmp_path / "store"
    reports = {
        form: build_variant(form, original, sha256_of(original), store, calibration, VariantGuard())
        for form in ("int8", "fp16")
    }
    assert reports["fp16"].usable, reports["fp16"].reason
    _check_against_direct_ort(reports["fp16"], original, feeds)
    assert reports["int8"].method == "static"
    assert not reports["int8"].usable and "cosine" in reports["int8"].reason
    _check_against_direct_ort(reports["int8"], original, feeds)


def test_silero_vads_variants_are_kept_out_with_the_reason(tmp_path):
    """silero-vad's INT8 copy is no smaller (its weights sit in subgraphs the
    quantizer does not reach), and its FP16 copy drifts on the recurrent state."""
    original = demo.fetch_silero(tmp_path / "repo" / "silero", cache=CACHE)
    t = np.arange(512) / 16000
    rng = np.random.default_rng(0)
    chunks = np.stack(
        [
            (0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.05 * rng.standard_normal(512)).astype(
                np.float32
            )[None]
            for i in range(16)
        ]
    )
    state = np.zeros((16, 2, 1, 128), np.float32)
    calibration_file = original.parent.parent / "calibration.npz"
    np.savez(calibration_file, input=chunks, state=state, sr=np.array(16000, np.int64))
    calibration = Calibration(file="calibration.npz")
    feeds = [
        {"input": c, "state": s, "sr": np.array(16000)} for c, s in zip(chunks, state, strict=True)
    ]
    store = tmp_path / "store"
    sha = sha256_of(original)
    int8 = build_variant("int8", original, sha, store, calibration, VariantGuard())
    assert not int8.usable and "saves no bytes" in int8.reason
    fp16 = build_variant("fp16", original, sha, store, calibration, VariantGuard())
    assert not fp16.usable and "stateN" in fp16.reason
    _check_against_direct_ort(fp16, original, feeds)


# --- a real agent ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    repo = tmp_path_factory.mktemp("variants-repo")
    for i in range(4):
        demo.make_mlp(repo / f"any{i}", width=512, layers=4, seed=i, in_width=64, config=ANY)
    exact = "variants: [int8]\nquality: exact\n"
    demo.make_mlp(repo / "exact", width=512, layers=4, seed=5, in_width=64, config=exact)
    strict = "variants: [int8]\nquality: any\nvariant_guard: {max_abs_error: 1.0e-9}\n"
    demo.make_mlp(repo / "strict", width=512, layers=4, seed=6, in_width=64, config=strict)
    proc = start_agent(
        repo,
        tmp_path_factory.mktemp("variants"),
        env={
            # Two originals (3.3 MB each, about 4 MB measured) and change; INT8 copies
            # are a quarter of that.
            "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": "9MiB",
            "EDGEPLEX_AGENT_LOAD_MODELS_AT_START": "false",
            "EDGEPLEX_AGENT_PRESTAGE": "false",
        },
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # variants build in the background
        models = status(proc)
        if all("variants" in models[n] and len(models[n]["variants"]) >= 1 for n in models):
            break
        time.sleep(0.2)
    yield proc
    assert proc.stop() == 0, proc.log()


def test_status_and_index_show_each_variants_figures_and_why_one_is_kept_out(agent):
    models = status(agent)
    int8 = models["any0"]["variants"]["int8"]
    assert int8["usable"] and int8["outputs"]["output"]["cosine"] >= 0.999
    assert models["any0"]["variants"]["fp16"]["usable"]
    strict = models["strict"]["variants"]["int8"]
    assert not strict["usable"] and "max abs error" in strict["reason"]
    request = urllib.request.Request(
        f"http://{agent.http_url}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        index = {m["name"]: m for m in json.loads(r.read())}
    assert index["any0"]["variants"]["int8"]["usable"]
    assert "variants" not in index.get("plain", {})


def test_under_pressure_models_that_accept_variants_stay_resident_as_int8(agent):
    seen: dict[str, set[str]] = {}
    for _ in range(6):
        for name in ["any0", "any1", "any2", "any3", "exact", "strict"]:
            code, headers, _ = infer_http(agent, name)
            assert code == 200, (name, code)
            seen.setdefault(name, set()).add(headers.get("edgeplex-variant", "original"))
    assert "int8" in set().union(*(seen[f"any{i}"] for i in range(4))), seen
    assert seen["exact"] == {"original"}  # quality: exact is never served from a variant
    assert seen["strict"] == {"original"}  # its variant failed its guard
    # gRPC names the variant in its trailing metadata (tritonclient does not expose
    # trailers; the raw stub does).
    forms = {m["name"]: m.get("form") for m in status(agent).values()}
    int8_model = next(n for n, f in forms.items() if f == "int8")
    request = pb.ModelInferRequest(model_name=int8_model)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.ones((1, 64), np.float32).tobytes())
    with grpc.insecure_channel(agent.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(request, timeout=30)
    assert dict(call.trailing_metadata()).get("edgeplex-variant") == "int8"


def test_bad_budgets_are_refused_and_when_the_budget_grows_the_originals_come_back(agent):
    for bad in (b'{"device_budget": "lots"}', b'{"device_budget": -1}', b"[]", b'{"x": 1}'):
        request = urllib.request.Request(
            f"http://{agent.http_url}/edgeplex/v1/memory", data=bad, method="POST", headers=AUTH
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 400 and b"device_budget" in info.value.read()
    variants = {n for n, m in status(agent).items() if m.get("form") == "int8"}
    assert variants
    request = urllib.request.Request(
        f"http://{agent.http_url}/edgeplex/v1/memory",
        data=b'{"device_budget": "64MiB"}',
        method="POST",
        headers=AUTH,
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert json.loads(r.read())["tiers"]["loaded"]["budget"] == 64 * MiB
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        forms = {n: status(agent)[n]["form"] for n in variants}
        if set(forms.values()) == {"original"}:
            break
        for name in variants:  # in use meanwhile: no request fails during a swap
            assert infer_http(agent, name)[0] == 200
        time.sleep(0.2)
    assert set(forms.values()) == {"original"}, forms
    for name in variants:
        code, headers, _ = infer_http(agent, name)
        assert code == 200 and "edgeplex-variant" not in headers
