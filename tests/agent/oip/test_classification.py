"""Triton's classification extension: an output asked for with a class count answers
with its top classes per batch row, "value:index:label", over both doors, as the
stock tritonclient asks for them (`class_count`); what cannot be classified is
refused naming the output."""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import numpy_helper
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.triton_config import read_triton_config
from edgeplex.agent.oip.classification import check, classify
from edgeplex.agent.oip.errors import InvalidInput
from tests.conftest import AgentProcess, start_agent

LABELS = [f"class {i}" for i in range(16)]
CONFIG = """
name: "scores"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ], label_filename: "labels.txt" },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
]
"""


def test_the_top_classes_per_row_with_labels_as_triton_writes_them() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [3.0, 3.0, 1.0]], np.float32)
    out = classify({"p": scores, "q": scores}, {"p": 2}, {"p": ["cat", "", "dog"]}, batched=True)
    assert out["p"].tolist() == [
        [b"0.700000:1", b"0.200000:2:dog"],  # no label for an empty line
        [b"3.000000:0:cat", b"3.000000:1"],  # equal values in index order
    ]
    assert out["q"] is scores  # not asked for: as it was
    ints = classify({"p": np.array([5, 9, 7], np.int64)}, {"p": 10}, {}, batched=False)
    assert ints["p"].tolist() == [b"9:1", b"7:2", b"5:0"]  # at most what there is
    with pytest.raises(InvalidInput, match="output 'p': 'classification' must be at least 1"):
        check({"p": 0}, {"p": "FP32"})
    with pytest.raises(InvalidInput, match="output 'p': BYTES outputs cannot be classified"):
        check({"p": 1}, {"p": "BYTES"})
    with pytest.raises(InvalidInput, match="'classification' 8193 for 8 rows is more than 65536"):
        check({"p": 8193}, {"p": "FP32"}, rows=8)  # before the run: no strings made


@pytest.mark.parametrize(
    ("label_filename", "reason"),
    [
        ("../labels.txt", "must name a file in the model's directory"),
        ("missing.txt", "no such file in the model's directory"),
    ],
)
def test_a_label_file_outside_the_model_or_missing_fails_the_model(
    tmp_path: Path, label_filename: str, reason: str
) -> None:
    model = tmp_path / "scores"
    model.mkdir()
    (tmp_path / "labels.txt").write_text("a\n")  # beside the model, not in it
    (model / "config.pbtxt").write_text(CONFIG.replace('"labels.txt"', f'"{label_filename}"'))
    with pytest.raises(ValueError, match=reason):
        read_triton_config(model / "config.pbtxt", "scores")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("classification")
    demo.make_add_sub(root / "repo" / "scores")
    (root / "repo" / "scores" / "config.pbtxt").write_text(CONFIG)
    (root / "repo" / "scores" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    demo.make_identity(root / "repo" / "strings", "BYTES")
    agent = start_agent(root / "repo", root)
    yield agent
    assert agent.stop() == 0, agent.log()


def _inputs(make: Callable[..., Any], a: np.ndarray, b: np.ndarray) -> list[Any]:
    """INPUT0 and INPUT1 as a tritonclient module's InferInput (`make`) holds them."""
    inputs = [make(f"INPUT{i}", list(a.shape), "FP32") for i in (0, 1)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _as_bytes(array: np.ndarray) -> list[list[bytes]]:
    return [[v if isinstance(v, bytes) else v.encode() for v in row] for row in array.tolist()]


def test_tritonclient_class_count_over_both_doors(classifier: AgentProcess) -> None:
    a = np.stack([np.arange(16, dtype=np.float32), np.arange(16, dtype=np.float32)[::-1]])
    b = np.zeros_like(a)
    top = [
        [b"15.000000:15:class 15", b"14.000000:14:class 14", b"13.000000:13:class 13"],
        [b"15.000000:0:class 0", b"14.000000:1:class 1", b"13.000000:2:class 2"],
    ]
    with th.InferenceServerClient(classifier.http_url) as http:
        for binary in (True, False):
            outputs = [
                th.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=3),
                th.InferRequestedOutput("OUTPUT1", binary_data=binary, class_count=2),
            ]
            result = http.infer("scores", _inputs(th.InferInput, a, b), outputs=outputs)
            assert result.get_output("OUTPUT0")["datatype"] == "BYTES"
            # As the stock client reads BYTES: bytes from binary data, str from JSON.
            assert _as_bytes(result.as_numpy("OUTPUT0")) == top
            assert _as_bytes(result.as_numpy("OUTPUT1"))[0] == [b"15.000000:15", b"14.000000:14"]
        plain = http.infer(
            "scores", _inputs(th.InferInput, a, b), outputs=[th.InferRequestedOutput("OUTPUT0")]
        )
        np.testing.assert_array_equal(plain.as_numpy("OUTPUT0"), a)  # no count: the values
        assert http.get_model_config("scores")["output"][0]["label_filename"] == "labels.txt"
    with tg.InferenceServerClient(classifier.grpc_url) as grpc:
        outputs = [tg.InferRequestedOutput("OUTPUT0", class_count=3)]
        result = grpc.infer("scores", _inputs(tg.InferInput, a, b), outputs=outputs)
        assert result.as_numpy("OUTPUT0").tolist() == top
        strings = tg.InferInput("INPUT", [1, 8], "BYTES")
        strings.set_data_from_numpy(np.array([[b"x"] * 8], dtype=object))
        asked = [tg.InferRequestedOutput("OUTPUT", class_count=1)]
        with pytest.raises(InferenceServerException, match="BYTES outputs cannot be classified"):
            grpc.infer("strings", [strings], outputs=asked)


def test_a_class_count_that_is_not_a_count_is_refused(classifier: AgentProcess) -> None:
    body = {
        "inputs": [
            {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}
            for i in (0, 1)
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": "three"}}],
    }
    url = f"http://{classifier.http_url}/v2/models/scores/infer"
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 400
    said = refused.value.read().decode()
    assert "output 'OUTPUT0': 'classification' must be a non-negative integer" in said


def test_tritons_quick_start_densenet_config_classifies_as_image_clients_ask(
    tmp_path: Path,
) -> None:
    """densenet_onnx as Triton's quick start configures it (input format and reshape,
    output reshape and label file), a small graph of its interface in place of
    DenseNet's: the top three classes of an image, over both doors, are the ones its
    weights give."""
    bench = Path(__file__).resolve().parents[3] / "bench"
    spec = importlib.util.spec_from_file_location("triton_examples", bench / "triton_examples.py")
    assert spec is not None and spec.loader is not None
    examples = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(bench))
    spec.loader.exec_module(examples)
    examples.build_densenet(tmp_path / "repo")
    model = onnx.load(str(tmp_path / "repo" / "densenet_onnx" / "1" / "model.onnx"))
    weights = next(numpy_helper.to_array(w) for w in model.graph.initializer if w.name == "weights")
    image = np.random.default_rng(2).random((3, 224, 224), dtype=np.float32)
    scores = image.mean(axis=(1, 2)) @ weights
    expected = [f"{scores[i]:f}:{i}:CLASS_{i}".encode() for i in np.argsort(-scores)[:3]]
    agent = start_agent(tmp_path / "repo", tmp_path)
    try:
        with th.InferenceServerClient(agent.http_url) as client:  # as clients see it
            assert client.get_model_metadata("densenet_onnx")["inputs"][0]["shape"] == [3, 224, 224]
            assert client.get_model_config("densenet_onnx")["input"][0]["format"] == "FORMAT_NCHW"
        for module, url in ((th, agent.http_url), (tg, agent.grpc_url)):
            with module.InferenceServerClient(url) as client:
                data = module.InferInput("data_0", [3, 224, 224], "FP32")
                data.set_data_from_numpy(image)
                asked = [module.InferRequestedOutput("fc6_1", class_count=3)]
                top = client.infer("densenet_onnx", [data], outputs=asked).as_numpy("fc6_1")
                got = [v if isinstance(v, bytes) else v.encode() for v in top.tolist()]
                # The sixth decimal may differ: ORT sums in another order than NumPy.
                assert [g.split(b":")[1:] for g in got] == [e.split(b":")[1:] for e in expected]
                assert [float(g.split(b":")[0]) for g in got] == pytest.approx(
                    [float(e.split(b":")[0]) for e in expected], abs=1e-5
                )
    finally:
        assert agent.stop() == 0, agent.log()
