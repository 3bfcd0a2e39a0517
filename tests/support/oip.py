"""OIP tensors for tritonclient, and ONNX Runtime's own answers to compare the
agent's with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as tg

DTYPES = {
    "FP32": np.float32,
    "FP16": np.float16,
    "INT64": np.int64,
    "INT32": np.int32,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}


def direct(repo: Path, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def inputs_for(feeds: dict[str, np.ndarray]) -> list[tg.InferInput]:
    out = []
    for name, array in feeds.items():
        tensor = tg.InferInput(name, list(array.shape), tg.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def silero_feeds() -> dict[str, np.ndarray]:
    """One 32 ms chunk of quiet noise at 16 kHz, with a fresh state."""
    rng = np.random.default_rng(1)
    return {
        "input": rng.standard_normal((1, 512), dtype=np.float32) * 0.1,
        "state": np.zeros((2, 1, 128), dtype=np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }
