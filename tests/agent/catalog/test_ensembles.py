"""Triton ensembles as config.pbtxt describes them: steps chained by input and output
maps, each step a model with its own residency, through the stock tritonclient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex import tenants
from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.ensemble import read_ensemble
from tests.conftest import AgentProcess, start_agent

PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "A_MINUS_B" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add_sub" model_version: -1
      input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "diff" } },
    { model_name: "add_sub" model_version: 1
      input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "diff" }
      output_map { key: "OUTPUT0" value: "TWICE_A" } },
    { model_name: "copy" model_version: -1
      input_map { key: "INPUT" value: "diff" } output_map { key: "OUTPUT" value: "A_MINUS_B" } }
  ]
}
"""


OUTER = """
name: "outer"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "pipeline" model_version: -1
  input_map { key: "A" value: "X" } input_map { key: "B" value: "Y" }
  output_map { key: "TWICE_A" value: "Z" } } ] }
"""


def ones(*names: str) -> list[tg.InferInput]:
    """One row of ones, 16 wide, for each input of `names`."""
    tensors = [tg.InferInput(name, [1, 16], "FP32") for name in names]
    for tensor in tensors:
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    return tensors


def _ensemble(repo: Path, name: str, text: str, version: str = "1") -> None:
    (repo / name / version).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("ensembles")
    repo = root / "repo"
    demo.make_add_sub(repo / "add_sub")
    demo.make_identity(repo / "copy", "FP32", width=16)
    _ensemble(repo, "pipeline", PIPELINE)
    _ensemble(
        repo, "broken", PIPELINE.replace('"pipeline"', '"broken"').replace('"copy"', '"gone"')
    )
    _ensemble(repo, "outer", OUTER)  # an ensemble with an ensemble as its step
    cached = PIPELINE.replace('"pipeline"', '"cached"') + "response_cache { enable: true }\n"
    _ensemble(repo, "cached", cached)
    _ensemble(repo, "third", PIPELINE.replace('"pipeline"', '"third"'), version="3")
    # Two ensembles whose steps lead to each other: neither can run.
    loop_a = PIPELINE.replace('"pipeline"', '"loop_a"').replace('"copy"', '"loop_b"')
    loop_b = PIPELINE.replace('"pipeline"', '"loop_b"').replace('"copy"', '"loop_a"')
    _ensemble(repo, "loop_a", loop_a)
    _ensemble(repo, "loop_b", loop_b)
    process = start_agent(repo, root)
    yield process
    assert process.stop() == 0, process.log()


def test_an_ensemble_chains_its_steps(agent: AgentProcess) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 5, dtype=np.float32)
    client = tg.InferenceServerClient(agent.grpc_url)
    inputs = [tg.InferInput("A", [2, 16], "FP32"), tg.InferInput("B", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("pipeline", inputs)
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("A_MINUS_B"), a - b)
    assert result.get_response().model_name == "pipeline"

    http = th.InferenceServerClient(agent.http_url)
    hinputs = [th.InferInput("A", [2, 16], "FP32"), th.InferInput("B", [2, 16], "FP32")]
    hinputs[0].set_data_from_numpy(a)
    hinputs[1].set_data_from_numpy(b, binary_data=False)
    only = [th.InferRequestedOutput("A_MINUS_B")]
    answer = http.infer("pipeline", hinputs, outputs=only)
    np.testing.assert_array_equal(answer.as_numpy("A_MINUS_B"), a - b)
    assert answer.as_numpy("TWICE_A") is None

    nested = [tg.InferInput("X", [2, 16], "FP32"), tg.InferInput("Y", [2, 16], "FP32")]
    nested[0].set_data_from_numpy(a)
    nested[1].set_data_from_numpy(b)
    np.testing.assert_array_equal(client.infer("outer", nested).as_numpy("Z"), 2 * a)

    assert client.is_model_ready("pipeline")
    metadata = client.get_model_metadata("pipeline")
    assert metadata.platform == "ensemble"
    assert [(t.name, list(t.shape)) for t in metadata.inputs] == [("A", [-1, 16]), ("B", [-1, 16])]
    config = http.get_model_config("pipeline")
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
        "add_sub", "add_sub", "copy",
    ]  # fmt: skip
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["pipeline"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "'gone' is not in the repository" in index["broken"]["reason"]
    for name in ("loop_a", "loop_b"):
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert "lead back to it" in index[name]["reason"], index[name]

    wrong = [tg.InferInput("A", [2, 16], "FP32"), tg.InferInput("C", [2, 16], "FP32")]
    for tensor in wrong:
        tensor.set_data_from_numpy(a)
    with pytest.raises(InferenceServerException, match="unexpected inference input 'C'"):
        client.infer("pipeline", wrong)
    with pytest.raises(InferenceServerException, match="missing required input"):
        client.infer("pipeline", inputs[:1])
    # A step's model failing its request fails the ensemble's, naming the step's model.
    short = [tg.InferInput("A", [2, 8], "FP32"), tg.InferInput("B", [2, 8], "FP32")]
    for tensor in short:
        tensor.set_data_from_numpy(np.ones((2, 8), np.float32))
    with pytest.raises(InferenceServerException, match="for model 'add_sub'"):
        client.infer("pipeline", short)

    # The ensemble's own statistics: its requests end to end, rows counted.
    # (Three succeeded: by gRPC, by HTTP, and as the step of `outer`; three failed.)
    (stats,) = http.get_inference_statistics("pipeline")["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 3), stats
    assert stats["inference_stats"]["success"]["count"] == 3, stats
    assert stats["inference_stats"]["fail"]["count"] == 3, stats
    everything = http.get_inference_statistics()["model_stats"]
    (outer,) = [m for m in everything if m["name"] == "outer"]
    assert outer["inference_stats"]["success"]["count"] == 1, outer
    grpc_stats = client.get_inference_statistics("pipeline").model_stats[0]
    assert grpc_stats.inference_stats.success.count == 3
    _, metrics = agent.http_get("/metrics")
    assert b'nv_inference_request_success{model="pipeline",version="1"} 3\n' in metrics

    # An ensemble's output classified, as a model's is: its top two per row.
    top = [tg.InferRequestedOutput("TWICE_A", class_count=2)]
    classes = client.infer("pipeline", inputs, outputs=top).as_numpy("TWICE_A")
    assert classes.tolist() == [
        [b"30.000000:15", b"28.000000:14"],
        [b"62.000000:15", b"60.000000:14"],
    ]


def test_an_ensemble_is_its_version_folders_newest_and_no_other(agent: AgentProcess) -> None:
    """As a model: a request naming another version of it is NOT_FOUND, not served."""
    client = tg.InferenceServerClient(agent.grpc_url)
    inputs = ones("A", "B")
    assert client.get_model_metadata("third").versions == ["3"]
    assert client.is_model_ready("third", "3") and not client.is_model_ready("third", "1")
    result = client.infer("third", inputs, model_version="3")
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), np.full((1, 16), 2.0))
    assert result.get_response().model_version == "3"
    with pytest.raises(InferenceServerException, match="'third' version 1 is not found") as err:
        client.infer("third", inputs, model_version="1")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    http = th.InferenceServerClient(agent.http_url)
    assert http.is_model_ready("third") and http.is_model_ready("third", "3")
    assert not http.is_model_ready("third", "1")
    for call in (
        lambda: http.get_model_metadata("pipeline", "2"),
        lambda: http.get_model_config("pipeline", "2"),
        lambda: http.get_inference_statistics("pipeline", "2"),
    ):
        with pytest.raises(InferenceServerException, match="'pipeline' version 2 is not found"):
            call()
    client.close()


def test_an_ensemble_with_the_response_cache_answers_again_without_its_steps(
    agent: AgentProcess,
) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    inputs = [tg.InferInput("A", [1, 16], "FP32"), tg.InferInput("B", [1, 16], "FP32")]
    a = np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16)
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    first = client.infer("cached", inputs)

    def steps_run() -> int:
        stats = client.get_inference_statistics("add_sub").model_stats
        return sum(s.inference_stats.success.count for s in stats)

    before = steps_run()
    again = client.infer("cached", inputs)
    np.testing.assert_array_equal(again.as_numpy("TWICE_A"), first.as_numpy("TWICE_A"))
    assert steps_run() == before  # no step ran
    stats = client.get_inference_statistics("cached").model_stats[0].inference_stats
    assert stats.cache_hit.count == 1 and stats.cache_miss.count == 1
    assert stats.success.count == 2


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda t: t.replace('value: "sum" }', 'value: "total" }', 1), "'sum' is read but no step"),
        (lambda t: t.replace('value: "A" }', 'value: "TWICE_A" }'), "cycle"),
        (lambda t: t.replace('"A_MINUS_B" } }', '"other" } }'), "'A_MINUS_B' is made by no step"),
        (lambda t: t.replace('"diff" } }', '"sum" } }', 1), "'sum' is made twice"),
    ],
)
def test_an_ensemble_that_cannot_run_says_why(tmp_path: Path, change, error: str) -> None:  # type: ignore[no-untyped-def]
    _ensemble(tmp_path, "pipeline", change(PIPELINE))
    with pytest.raises(ValueError, match=error):
        read_ensemble(tmp_path / "pipeline", {"add_sub", "copy"})


def test_an_ensembles_steps_run_under_its_tenant_without_counting_again(tmp_path: Path) -> None:
    """A tenant allowed the ensemble alone, with one request in flight at most, runs
    it: its steps are the ensemble's work, not requests of their own, and so are a
    nested ensemble's."""
    repo = tmp_path / "repo"
    demo.make_add_sub(repo / "add_sub")
    demo.make_identity(repo / "copy", "FP32", width=16)
    _ensemble(repo, "pipeline", PIPELINE)
    _ensemble(repo, "outer", OUTER)
    table = tenants.add(tenants.TenantTable(), "solo", {"concurrency": 1, "models": ["pipeline"]})
    table = tenants.add(table, "nest", {"concurrency": 1, "models": ["outer"]})
    table, key, _ = tenants.issue_key(table, "solo")
    table, nest_key, _ = tenants.issue_key(table, "nest")
    tenants.write_file(tmp_path / "tenants.yaml", table)
    agent = start_agent(
        repo,
        tmp_path,
        env={"EDGEPLEX_AGENT_SECURITY__TENANTS_FILE": str(tmp_path / "tenants.yaml")},
    )
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        inputs = ones("A", "B")
        auth = {"authorization": f"Bearer {key}"}
        result = client.infer("pipeline", inputs, headers=auth)
        np.testing.assert_array_equal(result.as_numpy("TWICE_A"), np.full((1, 16), 2.0))
        with pytest.raises(InferenceServerException, match="may not call model 'add_sub'"):
            client.infer("add_sub", [], headers=auth)  # a step's model, asked for directly
        nest = {"authorization": f"Bearer {nest_key}"}
        result = client.infer("outer", ones("X", "Y"), headers=nest)
        np.testing.assert_array_equal(result.as_numpy("Z"), np.full((1, 16), 2.0))
        with pytest.raises(InferenceServerException, match="may not call model 'pipeline'"):
            client.infer("pipeline", inputs, headers=nest)  # the nested one, directly
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_unload_dependents_takes_the_steps_no_served_ensemble_still_runs(tmp_path: Path) -> None:
    """Triton's unload_dependents: an ensemble unloaded alone leaves its steps' models
    serving; with its dependents they go too, unless another ensemble served runs
    them."""
    repo = tmp_path / "repo"
    demo.make_add_sub(repo / "add_sub")
    demo.make_identity(repo / "copy", "FP32", width=16)
    _ensemble(repo, "pipeline", PIPELINE)
    _ensemble(repo, "twin", PIPELINE.replace('"pipeline"', '"twin"'))
    agent = start_agent(repo, tmp_path, env={"EDGEPLEX_AGENT_MODEL_CONTROL_MODE": "explicit"})
    try:
        client = tg.InferenceServerClient(agent.grpc_url)  # loopback: control needs no token

        def ready() -> set[str]:
            index = client.get_model_repository_index().models
            return {m.name for m in index if m.state == "READY"}

        with pytest.raises(InferenceServerException, match="not supported for an ensemble"):
            client.load_model("pipeline", config='{"max_batch_size": 4}')  # not ignored
        assert ready() == set()
        client.load_model("pipeline")
        client.load_model("twin")
        assert ready() == {"add_sub", "copy", "pipeline", "twin"}
        client.unload_model("pipeline")
        assert ready() == {"add_sub", "copy", "twin"}
        client.load_model("pipeline")
        client.unload_model("pipeline", unload_dependents=True)  # twin still runs them
        assert ready() == {"add_sub", "copy", "twin"}
        with th.InferenceServerClient(agent.http_url) as http:
            http.unload_model("twin", unload_dependents=True)
        assert ready() == set()
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_an_ensembles_output_labels_are_read_and_shown(tmp_path: Path) -> None:
    labelled = PIPELINE.replace(
        '{ name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] }',
        '{ name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "labels.txt" }',
    )
    _ensemble(tmp_path, "pipeline", labelled)
    (tmp_path / "pipeline" / "labels.txt").write_text("".join(f"L{i}\n" for i in range(16)))
    ensemble = read_ensemble(tmp_path / "pipeline", {"add_sub", "copy"})
    assert ensemble.outputs[0].labels[15] == "L15"  # the classification's labels
    (twice, minus) = ensemble.config_json()["output"]  # type: ignore[misc]
    assert twice["label_filename"] == "labels.txt" and "label_filename" not in minus
