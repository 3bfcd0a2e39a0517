"""ONNX Runtime session options the runner tests build their sessions with."""

from __future__ import annotations

import onnxruntime as ort


def options() -> ort.SessionOptions:
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    o.add_session_config_entry("session.disable_prepacking", "1")
    return o
