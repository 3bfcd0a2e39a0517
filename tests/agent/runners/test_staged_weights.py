"""Sessions over the runner's kept mapping of a staged copy's weights: the
protobuf reader finds every external initializer where ONNX says it lies, the
session computes bit for bit what ORT's own mapping of the file computes, and
a mapping never outlives (or outlasts a replacement of) its file."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeplex.agent.catalog import demo, graph
from edgeplex.agent.runners.sessions import STAGED_MODEL, STAGED_WEIGHTS, stage_model
from edgeplex.agent.runners.staged_weights import StagedWeights, Unusable, WeightMaps
from tests.support.sessions import options

CPU = ["CPUExecutionProvider"]


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    demo.make_mlp(root / "mlp", width=256, layers=3, in_width=64)
    staged = root / "staged"
    stage_model(root / "mlp" / "1" / "model.onnx", staged, {}, CPU)
    return staged


def test_the_reader_finds_each_external_initializer_where_onnx_says(staged):
    model = onnx.load(str(staged / STAGED_MODEL), load_external_data=False)
    expected = {}
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            expected[tensor.name] = (
                tensor.data_type,
                tuple(tensor.dims),
                info["location"],
                int(info.get("offset", 0)),
                int(info["length"]),
            )
    found = {
        w.name: (w.data_type, w.dims, w.location, w.offset, w.length)
        for w in graph.read_external_weights(staged / STAGED_MODEL)
    }
    assert found == expected and len(found) >= 3


def test_a_session_over_the_kept_mapping_computes_what_the_mapped_file_does(staged):
    weights = StagedWeights(staged / STAGED_MODEL, staged / STAGED_WEIGHTS)
    handed = options()
    weights.hand_to(handed)
    ours = ort.InferenceSession(str(staged / STAGED_MODEL), handed, providers=CPU)
    ort_own = ort.InferenceSession(str(staged / STAGED_MODEL), options(), providers=CPU)
    x = np.random.default_rng(0).standard_normal((5, 64), dtype=np.float32)
    np.testing.assert_array_equal(
        ours.run(None, {"input": x})[0], ort_own.run(None, {"input": x})[0]
    )


def test_a_graph_without_external_weights_is_loaded_the_usual_way(tmp_path):
    demo.make_add_sub(tmp_path / "tiny")
    staged = tmp_path / "staged"
    stage_model(tmp_path / "tiny" / "1" / "model.onnx", staged, {}, CPU)
    with pytest.raises(Unusable):
        StagedWeights(staged / STAGED_MODEL, staged / STAGED_WEIGHTS)
    assert WeightMaps().get(staged, staged / STAGED_MODEL, staged / STAGED_WEIGHTS) is None


def test_a_mapping_follows_its_file(staged, tmp_path):
    copy = tmp_path / "staged"
    shutil.copytree(staged, copy)
    maps = WeightMaps()
    first = maps.get(copy, copy / STAGED_MODEL, copy / STAGED_WEIGHTS)
    assert first is not None
    assert maps.get(copy, copy / STAGED_MODEL, copy / STAGED_WEIGHTS) is first  # kept
    # Staged again (a new file under the same name): the old mapping is not used.
    shutil.rmtree(copy)
    shutil.copytree(staged, copy)
    second = maps.get(copy, copy / STAGED_MODEL, copy / STAGED_WEIGHTS)
    assert second is not None and second is not first
    # Deleted: the sweep lets the mapping (and the file's pages) go.
    shutil.rmtree(copy)
    maps.sweep()
    assert len(maps) == 0
