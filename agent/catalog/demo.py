"""Builds the demo model repository and the models the tests and benches use.

Needs the `onnx` package (extra `demo`). The real model is silero-vad, taken
out of its PyPI wheel with `pip download --no-deps` (none of its dependencies
are installed) and checked against a pinned sha256 before use.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger("edgeplex.demo")

SILERO_PACKAGE = "silero-vad==6.2.3"
SILERO_MEMBER = "silero_vad/data/silero_vad.onnx"
SILERO_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
PPOCR_PACKAGE = "rapidocr-onnxruntime==1.4.4"
PPOCR_CLS_MEMBER = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
PPOCR_CLS_SHA256 = "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"

# OIP datatype -> ONNX TensorProto enum name, for the identity models.
IDENTITY_TYPES = {
    "FP32": "FLOAT",
    "FP16": "FLOAT16",
    "FP64": "DOUBLE",
    "INT64": "INT64",
    "INT32": "INT32",
    "INT16": "INT16",
    "INT8": "INT8",
    "UINT8": "UINT8",
    "BOOL": "BOOL",
    "BYTES": "STRING",
}


def _save(model, directory: Path, config: str | None = None) -> Path:  # type: ignore[no-untyped-def]
    import onnx

    onnx.checker.check_model(model)
    (directory / "1").mkdir(parents=True, exist_ok=True)
    path = directory / "1" / "model.onnx"
    onnx.save(model, path)
    if config is not None:
        (directory / "config.yaml").write_text(config)
    return path


def _model(graph):  # type: ignore[no-untyped-def]
    from onnx import helper

    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def make_add_sub(directory: Path, width: int = 16, config: str | None = None) -> Path:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [-1, width]."""
    from onnx import TensorProto, helper

    def v(name: str):  # type: ignore[no-untyped-def]
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        [v("INPUT0"), v("INPUT1")],
        [v("OUTPUT0"), v("OUTPUT1")],
    )
    return _save(_model(graph), directory, config)


def make_identity(directory: Path, datatype: str, width: int = 8) -> Path:
    """OUTPUT = Identity(INPUT) for one datatype, shape [-1, width]."""
    from onnx import TensorProto, helper

    elem = getattr(TensorProto, IDENTITY_TYPES[datatype])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        f"identity_{datatype.lower()}",
        [helper.make_tensor_value_info("INPUT", elem, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT", elem, ["batch", width])],
    )
    return _save(_model(graph), directory)


def make_mlp(
    directory: Path,
    width: int,
    layers: int,
    seed: int = 0,
    config: str | None = None,
    in_width: int | None = None,
) -> Path:
    """A ReLU MLP over FP32 [-1, in_width]: `layers` Gemm layers of width x width."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    in_width = in_width or width
    nodes, inits = [], []
    prev, prev_width = "input", in_width
    for i in range(layers):
        w = (rng.standard_normal((prev_width, width)) / np.sqrt(prev_width)).astype(np.float32)
        b = (rng.standard_normal(width) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = f"h{i}" if i < layers - 1 else "output"
        gemm_out = out if i == layers - 1 else f"g{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [gemm_out]))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [gemm_out], [out]))
        prev, prev_width = out, width
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", in_width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
        initializer=inits,
    )
    return _save(_model(graph), directory, config)


def make_broken(directory: Path) -> Path:
    """A model.onnx that is not ONNX at all."""
    (directory / "1").mkdir(parents=True, exist_ok=True)
    path = directory / "1" / "model.onnx"
    path.write_bytes(b"this is not an ONNX model\n" * 4)
    return path


def fetch_silero(directory: Path, cache: Path | None = None) -> Path:
    """Extract silero-vad's ONNX file from its wheel into directory/1/model.onnx.

    `cache`, when given, keeps a verified copy so later calls skip the download."""
    return _from_wheel(SILERO_PACKAGE, SILERO_MEMBER, SILERO_SHA256, directory, cache)


SILERO_STREAM_CONFIG = """\
name: "silero_vad_stream"
max_batch_size: 0
# Chunks of one audio stream are one sequence: the agent carries the model's state
# (stateN of a chunk is the state of the next) and holds the model while it lives.
# The model does not batch, so the oldest strategy's candidates are the streams that
# may be live at once (direct would allow one); a 17th waits for one to end.
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 16 }
  state [ { input_name: "state" output_name: "stateN" data_type: TYPE_FP32 dims: [ 2, 1, 128 ] } ]
}
"""


def make_silero_stream(directory: Path, cache: Path | None = None) -> Path:
    """silero-vad as a stateful sequence model: requests carry `input` (a [1, 512]
    chunk of 16 kHz audio) and `sr`; the recurrent state stays in the agent."""
    path = fetch_silero(directory, cache)
    (directory / "config.pbtxt").write_text(SILERO_STREAM_CONFIG)
    return path


def fetch_ppocr_cls(directory: Path, cache: Path | None = None) -> Path:
    """PP-OCR's text-direction classifier (a small convolutional network, two class
    scores per image), from rapidocr-onnxruntime's wheel, like fetch_silero."""
    return _from_wheel(PPOCR_PACKAGE, PPOCR_CLS_MEMBER, PPOCR_CLS_SHA256, directory, cache)


def _from_wheel(
    package: str, member: str, sha256: str, directory: Path, cache: Path | None
) -> Path:
    target = directory / "1" / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    stem = Path(member).stem
    cached = cache / f"{stem}-{sha256[:16]}.onnx" if cache else None
    if cached is not None and cached.is_file():
        data = cached.read_bytes()
        if hashlib.sha256(data).hexdigest() == sha256:
            target.write_bytes(data)
            return target
    with tempfile.TemporaryDirectory() as tmp:
        download = Path(tmp)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
            str(download),
            package,
        ]
        subprocess.run(cmd, check=True)
        wheel = next(download.glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{package} {member}: sha256 {digest} != pinned {sha256}")
    for path in (target, cached):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Its own partial file: processes filling one cache at once (test workers)
            # each rename a whole copy, and the last one's stays.
            partial = path.with_suffix(f".{os.getpid()}.partial")
            partial.write_bytes(data)
            partial.replace(path)
    return target


def make_slow(directory: Path, size: int = 256, depth: int = 24, config: str | None = None) -> Path:
    """FP32 [-1, size, size] -> `depth` chained self-MatMuls: slow, with no weights.

    Each batch element costs depth * 2 * size^3 flops (~0.8 GFLOP by default), so
    tests can make a request run long by sending a larger batch."""
    from onnx import TensorProto, helper

    nodes = []
    prev = "input"
    for i in range(depth):
        out = "output" if i == depth - 1 else f"m{i}"
        nodes.append(helper.make_node("MatMul", [prev, prev], [out]))
        prev = out
    shape: list[str | int | None] = ["batch", size, size]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
    )
    return _save(_model(graph), directory, config)


def build_demo_repo(
    repo: Path,
    force: bool = False,
    with_medium: bool = True,
    on_step: Callable[[str, int], None] | None = None,
) -> Path:
    """The demo repository: silero-vad plus generated models. Idempotent.
    `on_step(model, steps)` is called before each model is made."""
    marker = repo / ".edgeplex-demo"
    if marker.exists() and not force:
        log.info("demo repository already built")
        return repo
    if force and repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("silero_vad", lambda: fetch_silero(repo / "silero_vad")),
        ("silero_vad_stream", lambda: make_silero_stream(repo / "silero_vad_stream")),
        ("add_sub", lambda: make_add_sub(
            repo / "add_sub", config="max_batch_size: 8\nmax_queue_delay_us: 200\n")),
        ("mlp_small", lambda: make_mlp(repo / "mlp_small", width=320, layers=2, in_width=512)),
    ]  # fmt: skip
    if with_medium:  # ~50 MB
        steps.append(("mlp_medium", lambda: make_mlp(
            repo / "mlp_medium", width=1024, layers=12, seed=1,
            config="isolation: dedicated\nmax_batch_size: 16\n")))  # fmt: skip
    for datatype in ("FP32", "FP16", "INT64", "INT32", "INT8", "UINT8", "BOOL"):
        name = f"identity_{datatype.lower()}"
        steps.append((name, functools.partial(make_identity, repo / name, datatype)))
    for name, make in steps:
        if on_step is not None:
            on_step(name, len(steps))
        make()
    marker.write_text("built by `edgeplex demo-repo`\n")
    return repo
