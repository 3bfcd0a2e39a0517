"""Models with one graph share one session: the graph without its weights is the
same bytes for every model of an architecture, a session of it fed a model's
weights computes bit for bit what that model's own session computes, and a
graph that cannot be shared is loaded the usual way."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeplex.agent.catalog import demo, graph
from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.sessions import STAGED_MODEL, STAGED_WEIGHTS, stage_model
from edgeplex.agent.runners.shared_graphs import SharedGraphs, WithWeights, session_for
from edgeplex.agent.runners.staged_weights import StagedWeights
from tests.support.sessions import options

CPU = ["CPUExecutionProvider"]


def staged_mlp(root, name, width, seed):
    demo.make_mlp(root / name, width=width, layers=3, seed=seed, in_width=64)
    staged = root / f"{name}-staged"
    stage_model(root / name / "1" / "model.onnx", staged, {}, CPU)
    return staged


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    return {
        "a": staged_mlp(root, "a", 256, seed=1),
        "b": staged_mlp(root, "b", 256, seed=2),
        "wide": staged_mlp(root, "wide", 320, seed=3),
    }


def load_request(staged, **changes) -> ipc.LoadModel:
    fields = dict(
        req_id=1,
        model=staged.name,
        path="",
        staged_dir=str(staged),
        intra_op_threads=1,
        inter_op_threads=1,
        allow_spinning=False,
        prepack_weights=False,
        provider="cpu",
        device_id=0,
        memory_limit=0,
        instances=1,
    )
    fields.update(changes)
    return ipc.LoadModel(**fields)


def weights(staged) -> StagedWeights:
    return StagedWeights(staged / STAGED_MODEL, staged / STAGED_WEIGHTS)


def test_one_architecture_leaves_one_weightless_graph(catalog):
    a, b, wide = (weights(catalog[k]) for k in ("a", "b", "wide"))
    assert a.weightless is not None and a.weightless == b.weightless
    assert a.weightless_digest == b.weightless_digest != wide.weightless_digest
    model = onnx.load_from_string(a.weightless)
    external = {w.name for w in graph.read_external_weights(catalog["a"] / STAGED_MODEL)}
    assert not {t.name for t in model.graph.initializer} & external
    declared = {i.name: i.type.tensor_type for i in model.graph.input}
    for w in graph.read_external_weights(catalog["a"] / STAGED_MODEL):
        assert declared[w.name].elem_type == w.data_type
        assert tuple(d.dim_value for d in declared[w.name].shape.dim) == w.dims
    onnx.checker.check_model(model)


def test_a_shared_session_computes_bit_for_bit_what_each_models_own_does(catalog):
    graphs = SharedGraphs()
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    seen = set()
    for name in ("a", "b", "wide"):
        staged = catalog[name]
        kept = weights(staged)
        session, feeds = session_for(graphs, load_request(staged), staged, options(), kept)
        assert feeds is kept.arrays and feeds
        seen.add(id(session))
        own = ort.InferenceSession(str(staged / STAGED_MODEL), options(), providers=CPU)
        expected = own.run(None, {"input": x})[0]
        got = WithWeights(session, feeds).run(None, {"input": x})[0]
        np.testing.assert_array_equal(got, expected)
        # A request cannot replace a weight: the model's own are fed last.
        name0 = next(iter(feeds))
        forged = {"input": x, name0: np.zeros_like(feeds[name0])}
        np.testing.assert_array_equal(WithWeights(session, feeds).run(None, forged)[0], expected)
    assert graphs.created == 2 and len(seen) == 2  # a and b share; wide has its own


def test_session_settings_and_opt_outs_keep_sessions_apart(catalog):
    graphs = SharedGraphs()
    staged = catalog["a"]
    kept = weights(staged)
    first, _ = session_for(graphs, load_request(staged), staged, options(), kept)
    assert graphs.find(kept, load_request(staged)) is first
    assert graphs.find(kept, load_request(staged, intra_op_threads=2)) is None
    other, _ = session_for(
        graphs, load_request(staged, intra_op_threads=2), staged, options(), kept
    )
    assert other is not first
    for opt_out in (dict(share_graphs=False), dict(prepack_weights=True)):
        own, feeds = session_for(graphs, load_request(staged, **opt_out), staged, options(), kept)
        assert feeds == {} and own is not first
    assert graphs.created == 2


def test_idle_sessions_are_kept_up_to_a_bound_and_live_ones_always(catalog):
    graphs = SharedGraphs(keep_idle=1)
    a, wide = weights(catalog["a"]), weights(catalog["wide"])
    held, _ = session_for(graphs, load_request(catalog["a"]), catalog["a"], options(), a)
    session_for(graphs, load_request(catalog["wide"]), catalog["wide"], options(), wide)
    # Only one idle session is kept, but a's is held by a model: still found.
    assert graphs.find(a, load_request(catalog["a"])) is held
    # A session found is used again: the most recent, the one idle session kept.
    del held
    assert graphs.find(a, load_request(catalog["a"])) is not None
    assert graphs.find(wide, load_request(catalog["wide"])) is None


def test_a_weight_that_is_also_an_input_is_not_shared(tmp_path, catalog):
    # Before IR version 4 (and in some exports) weights are also graph inputs, which a
    # caller may override: such a graph keeps its own session.
    model = onnx.load(str(catalog["a"] / STAGED_MODEL), load_external_data=False)
    first = model.graph.initializer[0]
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            first = tensor
            break
    model.graph.input.append(
        onnx.helper.make_tensor_value_info(first.name, first.data_type, list(first.dims))
    )
    staged = tmp_path / "staged"
    staged.mkdir()
    onnx.save(model, str(staged / STAGED_MODEL))
    (staged / STAGED_WEIGHTS).write_bytes((catalog["a"] / STAGED_WEIGHTS).read_bytes())
    with pytest.raises(graph.GraphError, match="also a graph input"):
        graph.weights_as_inputs(
            staged / STAGED_MODEL, graph.read_external_weights(staged / STAGED_MODEL)
        )
    kept = weights(staged)
    assert kept.weightless is None
    session, feeds = session_for(SharedGraphs(), load_request(staged), staged, options(), kept)
    assert feeds == {}
    x = np.ones((1, 64), np.float32)
    own = ort.InferenceSession(str(catalog["a"] / STAGED_MODEL), options(), providers=CPU)
    np.testing.assert_array_equal(
        session.run(None, {"input": x})[0], own.run(None, {"input": x})[0]
    )
