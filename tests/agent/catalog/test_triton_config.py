"""Triton repositories unchanged: config.pbtxt parsed, mapped, checked against the
graph, and what edgeplex does not act on named, never dropped silently."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig as ModelConfigMessage
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.repository import scan_model, unservable
from edgeplex.agent.catalog.triton_config import (
    PbtxtError,
    parse_config_json,
    parse_pbtxt,
    read_triton_config,
    triton_config,
)
from edgeplex.agent.config import ModelConfig
from edgeplex.net import free_ports
from tests.conftest import start_agent

TRITON_ADD_SUB = """
# A config as Triton's docs write them.
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }
output < name: 'OUTPUT1' data_type: TYPE_FP32 dims: [ -1 ] >
dynamic_batching {
  max_queue_delay_microseconds: 100
  preferred_batch_size: [ 4, 8 ]
  preserve_ordering: true
  default_queue_policy { max_queue_size: 64 default_timeout_microseconds: 2000000 }
}
instance_group [ { count: 2, kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1 ] } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
parameters { key: "enable_mem_arena" value: { string_value: "0" } }
parameters { key: "arena_extend_strategy" value: { string_value: "0" } }
parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }
optimization { input_pinned_memory { enable: true } }
model_warmup [
  {
    name: "zeros"
    batch_size: 2
    count: 3
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } }
  }
]
"""


def test_text_format_parses_lists_nesting_strings_and_enums() -> None:
    data = parse_pbtxt(TRITON_ADD_SUB)
    assert data["name"] == ["add_sub"] and data["max_batch_size"] == [8]
    assert [t["name"][0] for t in data["input"]] == ["INPUT0", "INPUT1"]
    assert [t["name"][0] for t in data["output"]] == ["OUTPUT0", "OUTPUT1"]  # repeated field
    assert data["input"][1]["data_type"] == ["TYPE_FP32"]
    assert data["dynamic_batching"][0]["preferred_batch_size"] == [4, 8]
    assert data["version_policy"][0]["specific"][0]["versions"] == [1]
    assert parse_pbtxt('name: "a\\tb" "c"')["name"] == ["a\tbc"]  # escapes, concatenation
    params = parse_pbtxt(TRITON_ADD_SUB)["parameters"]  # a map: key and value, by key
    assert [p["key"][0] for p in params] == [
        "arena_extend_strategy",
        "cudnn_conv_algo_search",
        "enable_mem_arena",
        "intra_op_thread_count",
        "memory.enable_memory_arena_shrinkage",
    ]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('name: "x"\ninput [ { name: "a" \n', 'line 2:17 : Expected "}"'),  # unclosed
        ('name: "x"\nmax_batch_sizee: 8\n', 'line 2:1 .*no field named "max_batch_sizee"'),
        ('input [ { name: "x" data_type: TYPE_NOPE } ]', "line 1:.*TYPE_NOPE"),
    ],
)
def test_a_field_or_value_triton_does_not_know_is_an_error_naming_its_line(
    text: str, where: str
) -> None:
    with pytest.raises(PbtxtError, match=where):
        parse_pbtxt(text)


def test_a_load_config_override_is_json_as_strict_as_the_file() -> None:
    assert parse_config_json('{"max_batch_size": "16"}') == {"max_batch_size": [16]}
    with pytest.raises(PbtxtError, match="max_batch_sizee"):
        parse_config_json('{"max_batch_sizee": 16}')
    with pytest.raises(PbtxtError):
        parse_config_json('"parameters": {"config": {{"max_batch_size": "16"}}}')


def test_triton_fields_map_and_the_rest_are_named(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(TRITON_ADD_SUB)
    config = read_triton_config(path, "add_sub")
    assert config.settings == {
        "max_batch_size": 8,
        "max_queue_delay_us": 100,
        "preferred_batch_sizes": [4, 8],
        "max_queue_size": 64,
        "timeout_ms": 2000,
        # As Triton's: a queue policy rejects, and ignores a request's timeout, unless
        # it says otherwise.
        "timeout_action": "reject",
        "allow_timeout_override": False,
        "instance_count": 2,
        "intra_op_threads": 1,
        "gpu_arena": "next_power_of_two",  # arena_extend_strategy 0
    }
    # The onnxruntime backend's parameters edgeplex passes on, as Triton's are.
    assert config.ort_parameters == {"cudnn_conv_algo_search": "1", "enable_mem_arena": "0"}
    assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"]
    assert config.outputs[1].dims == (-1,)
    assert config.version_policy.select([3, 2, 1]) == [1]
    text = "\n".join(config.warnings)
    for unsupported in ("optimization", "memory.enable_memory_arena_shrinkage"):
        assert unsupported in text, text
    assert "preferred_batch_size" not in text, text  # acted on
    assert "preserve_ordering" not in text, text  # always so


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('name: "other"', "does not match the model's directory 'm'"),
        ('platform: "tensorflow_savedmodel"', "edgeplex serves ONNX models"),
        ('input [ { name: "x" data_type: TYPE_NOPE } ]', "TYPE_NOPE"),
        ("max_batch_sizee: 8", "no field named"),
        ('parameters { key: "intra_op_thread_count" value: { string_value: "two" } }', "integer"),
        ('parameters { key: "execution_mode" value: { string_value: "2" } }', "not one of 0, 1"),
        ('parameters { key: "gpu_mem_limit" value: { string_value: "-1" } }', "not a count"),
    ],
)
def test_what_cannot_be_served_as_written_is_an_error(
    tmp_path: Path, body: str, error: str
) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(body)
    with pytest.raises(ValueError, match=error):
        read_triton_config(path, "m")


def test_config_yaml_wins_over_config_pbtxt_and_the_policy_picks_the_version(
    tmp_path: Path,
) -> None:
    demo.make_add_sub(tmp_path / "add_sub")
    shutil.copytree(tmp_path / "add_sub" / "1", tmp_path / "add_sub" / "2")
    (tmp_path / "add_sub" / "config.pbtxt").write_text(TRITON_ADD_SUB)
    (tmp_path / "add_sub" / "config.yaml").write_text("max_queue_delay_us: 500\n")
    source = scan_model(tmp_path, "add_sub", ModelConfig())
    assert source is not None and source.config is not None, source
    assert source.version == "1"  # version_policy specific [1], though 2 exists
    assert source.config.max_queue_delay_us == 500  # config.yaml
    assert source.config.max_queue_size == 64  # config.pbtxt
    assert any("optimization" in w for w in source.warnings)
    (tmp_path / "add_sub" / "config.pbtxt").write_text(
        "version_policy: { specific: { versions: [ 7 ] } }"
    )
    source = scan_model(tmp_path, "add_sub", ModelConfig())
    assert source is not None and source.config is None
    assert "selects none of the versions present" in source.config_error


def test_priority_levels_map_and_a_request_gets_a_level_the_model_has() -> None:
    data = parse_pbtxt("dynamic_batching { priority_levels: 3 default_priority_level: 2 }")
    settings = triton_config(data, "m").settings
    assert settings == {"priority_levels": 3, "default_priority_level": 2}
    config = ModelConfig(**settings)
    assert [config.priority_level(asked) for asked in (0, 1, 3, 4)] == [2, 1, 3, 2]
    assert ModelConfig().priority_level(1) == 0  # no levels: one queue
    with pytest.raises(ValueError, match=r"default priority level must be in range \[1, 3\]"):
        ModelConfig(priority_levels=3, default_priority_level=0)


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton-repo")
    demo.make_add_sub(repo / "add_sub")
    shutil.copytree(repo / "add_sub" / "1", repo / "add_sub" / "2")
    (repo / "add_sub" / "config.pbtxt").write_text(TRITON_ADD_SUB)
    demo.make_add_sub(repo / "misdeclared")
    without_warmup = TRITON_ADD_SUB.split("model_warmup")[0]  # its dims are the inputs'
    (repo / "misdeclared" / "config.pbtxt").write_text(
        without_warmup.replace('"add_sub"', '"misdeclared"').replace(
            "dims: [ 16 ]", "dims: [ 3 ]", 1
        )
    )
    demo.make_add_sub(repo / "plain")  # no config at all: read from the graph
    demo.make_add_sub(repo / "two")  # versions 1 and 2, both served
    shutil.copytree(repo / "two" / "1", repo / "two" / "2")
    shutil.copytree(repo / "two" / "1", repo / "two" / "3")
    (repo / "two" / "config.pbtxt").write_text(
        'name: "two"\nmax_batch_size: 8\nversion_policy: { latest: { num_versions: 2 } }\n'
    )
    preferred = (
        'name: "{}"\nmax_batch_size: 8\n'
        "dynamic_batching {{ preferred_batch_size: [ {} ] "
        "max_queue_delay_microseconds: 3000000 }}\n"
    )
    demo.make_add_sub(repo / "preferred")
    (repo / "preferred" / "config.pbtxt").write_text(preferred.format("preferred", 4))
    demo.make_add_sub(repo / "too_preferred")
    (repo / "too_preferred" / "config.pbtxt").write_text(preferred.format("too_preferred", 16))
    return repo


def test_a_triton_repository_serves_through_tritonclient(triton_repo: Path, tmp_path: Path) -> None:
    agent = start_agent(triton_repo, tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url)
        config = client.get_model_config("add_sub")
        assert config["max_batch_size"] == 8
        assert config["instance_group"] == [{"count": 2, "kind": "KIND_AUTO"}]
        assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
        assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        b = np.ones((2, 16), dtype=np.float32)
        inputs = [
            th.InferInput("INPUT0", [2, 16], "FP32"),
            th.InferInput("INPUT1", [2, 16], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs, model_version="1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        # Triton's words, which its examples match, then what edgeplex adds.
        unknown = (
            r"Request for unknown model: 'add_sub' version 2 is not found \(serving version 1\)"
        )
        with pytest.raises(InferenceServerException, match=unknown):
            client.infer("add_sub", inputs, model_version="2")  # the policy serves 1 only
        result = client.infer("plain", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        # latest 2 of versions 1-3: 3 and 2 serve, 3 without a version, 1 not at all.
        for asked, answered in (("", "3"), ("3", "3"), ("2", "2")):
            result = client.infer("two", inputs, model_version=asked)
            assert result.get_response()["model_version"] == answered
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        with pytest.raises(InferenceServerException, match="'two' version 1 is not found"):
            client.infer("two", inputs, model_version="1")
        assert client.is_model_ready("two", "2")
        # A declaration the graph contradicts: FAILED with the reason; the rest serve.
        with pytest.raises(InferenceServerException):
            client.infer("misdeclared", inputs)
        status, body = agent.http_get("/edgeplex/v1/status")
        assert status == 200
        by_name = {e["name"]: e for e in json.loads(body)}
        assert "input 'INPUT0' dims [3]" in by_name["misdeclared"]["reason"], by_name["misdeclared"]
        warnings = "\n".join(by_name["add_sub"]["warnings"])
        assert "optimization" in warnings and "preferred_batch_size" not in warnings
        assert by_name["add_sub"]["instances"] == 2  # instance_group count
        assert "optimization" in agent.log()  # logged too
    finally:
        assert agent.stop() == 0, agent.log()


def test_each_version_counts_apart_in_statistics_and_tritons_metrics(
    triton_repo: Path, tmp_path: Path
) -> None:
    """`two` serves versions 3 and 2 (version_policy latest 2): its statistics and
    nv_* series are per version, failures carry Triton's reason, and the pending
    gauge is there."""
    agent = start_agent(triton_repo, tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url)
        inputs = [th.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        (older,) = [
            m
            for m in client.get_model_repository_index()
            if m["name"] == "two" and m["version"] == "2"
        ]
        # An older version, not yet asked for: served, loaded on its first request.
        assert older["state"] == "READY", older
        assert older["reason"].endswith("loaded on its next request"), older
        assert client.is_model_ready("two", "2")
        for version in ("", "3", "2"):  # 3 twice (the newest answers no version), 2 once
            client.infer("two", inputs, model_version=version)
        wrong = [th.InferInput("INPUT0", [1, 16], "FP32")]  # INPUT1 missing
        wrong[0].set_data_from_numpy(np.ones((1, 16), np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("two", wrong, model_version="2")
        stats = client.get_inference_statistics("two")["model_stats"]
        by_version = {s["version"]: s["inference_stats"] for s in stats}
        assert set(by_version) == {"2", "3"}
        assert by_version["3"]["success"]["count"] == 2
        assert by_version["2"]["success"]["count"] == 1
        assert client.get_model_metadata("two")["versions"] == ["2", "3"]
        index = [(m["version"], m["state"]) for m in client.get_model_repository_index()
                 if m["name"] == "two"]  # fmt: skip
        assert index == [("2", "READY"), ("3", "READY")]  # each version, as Triton lists them
        assert client.get_model_metadata("two", "2")["versions"] == ["2"]
        one = client.get_inference_statistics("two", "2")["model_stats"]
        assert [s["version"] for s in one] == ["2"]
        text = agent.http_get("/metrics")[1].decode()
        samples = {
            line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith("nv_inference_") and 'model="two"' in line
        }
        assert samples['nv_inference_request_success{model="two",version="3"}'] == 2
        assert samples['nv_inference_request_success{model="two",version="2"}'] == 1
        for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED"):
            series = f'nv_inference_request_failure{{model="two",reason="{reason}",version="2"}}'
            # A request missing an input fails validation before any execution: OTHER.
            assert samples[series] == (1 if reason == "OTHER" else 0), series
        assert samples['nv_inference_pending_request_count{model="two",version="3"}'] == 0
        assert "# TYPE nv_inference_pending_request_count gauge" in text
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_preferred_batch_size_goes_without_waiting_out_the_delay(
    triton_repo: Path, tmp_path: Path
) -> None:
    """`preferred` may hold a batch 3 s for more to join, and prefers 4: four requests
    sent together run as one batch of 4 at once. A preferred size above
    max_batch_size fails its model, in Triton's words."""
    agent = start_agent(triton_repo, tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url, concurrency=4)
        batching = client.get_model_config("preferred")["dynamic_batching"]
        assert batching["preferred_batch_size"] == [4]

        def ones(rows: int) -> list[th.InferInput]:
            inputs = [th.InferInput(n, [rows, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((rows, 16), np.float32))
            return inputs

        client.infer("preferred", ones(4))  # promoted, by a request of the preferred size
        inputs = ones(1)
        started = time.monotonic()
        pending = [client.async_infer("preferred", inputs) for _ in range(4)]
        for call in pending:
            np.testing.assert_array_equal(call.get_result().as_numpy("OUTPUT0"), 2.0)
        assert time.monotonic() - started < 2.0  # not the 3 s delay
        stats = client.get_inference_statistics("preferred")["model_stats"][0]
        batches = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        assert batches == {4: 2}, batches
        with pytest.raises(InferenceServerException):
            client.infer("too_preferred", inputs)
        body = agent.http_get("/edgeplex/v1/status")[1]
        reason = {e["name"]: e for e in json.loads(body)}["too_preferred"]["reason"]
        assert "preferred size must be <= max batch size" in reason, reason
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_metrics_port_serves_metrics_alone(triton_repo: Path, tmp_path: Path) -> None:
    """As Triton's --metrics-port: GET /metrics there, nothing else; the HTTP port
    keeps its /metrics."""
    (metrics_port,) = free_ports(1)
    env = {"EDGEPLEX_AGENT_METRICS_PORT": str(metrics_port)}
    agent = start_agent(triton_repo, tmp_path, env=env)
    try:
        url = f"http://127.0.0.1:{metrics_port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        assert 'nv_inference_request_success{model="add_sub",version="1"}' in text
        assert "edgeplex_agent_requests_total" in text
        for path in ("/v2/health/ready", "/v2/models/add_sub", "/v2/repository/index"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{url}{path}", timeout=10)
            assert refused.value.code in (404, 405), path
        assert agent.http_get("/metrics")[0] == 200
    finally:
        assert agent.stop() == 0, agent.log()


TRITON_SEQUENCE = """
name: "seq"
platform: "onnxruntime_onnx"
max_batch_size: 4
input { name: "x" data_type: TYPE_FP32 dims: [ 2 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 2, 4 ]
    max_queue_delay_microseconds: 300
  }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
  state [
    { input_name: "h" output_name: "hN" data_type: TYPE_FP32 dims: [ 2 ]
      initial_state { name: "zeros" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } },
    { input_name: "c" output_name: "cN" data_type: TYPE_FP32 dims: [ 2 ]
      initial_state { name: "file" data_type: TYPE_FP32 dims: [ 2 ] data_file: "c0" } }
  ]
  iterative_sequence: true
}
"""


def test_the_sequence_batchers_fields_map_and_the_rest_are_named(tmp_path: Path) -> None:
    """The strategy's batching delay and preferred sizes are the model's, its
    candidates are the slots, and a state's initial values are read from the model's
    initial_state folder; what the sequence batcher does not act on (iterative
    sequences) is named in a warning, as for every other field."""
    path = tmp_path / "config.pbtxt"
    path.write_text(TRITON_SEQUENCE)
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "c0").write_bytes(np.array([1.5, -2], np.float32).tobytes())
    config = read_triton_config(path, "seq")
    assert config.settings["max_queue_delay_us"] == 300
    assert config.settings["preferred_batch_sizes"] == [2, 4]
    assert config.sequence is not None and config.sequence.strategy == "oldest"
    assert config.sequence.slots(max_batch_size=4, instances=2) == 8  # 4 candidates each
    assert {s.input for s in config.sequence.states} == {"h", "c"}
    text = "\n".join(config.warnings)
    assert "sequence_batching.iterative_sequence" in text, text
    assert "max_candidate_sequences" not in text and "preferred_batch_size" not in text, text
    assert "initial_state" not in text, text
    h, c = config.sequence.states
    assert h.initial is None and c.initial is not None and c.initial.tolist() == [1.5, -2]
    # Served back as Triton's config endpoint shows it, valid as Triton's message.
    shown = config.sequence.config_json(300, [2, 4])
    message = json_format.ParseDict({"sequence_batching": shown}, ModelConfigMessage())
    back = message.sequence_batching
    assert back.max_sequence_idle_microseconds == 5_000_000
    assert back.oldest.max_candidate_sequences == 4
    assert list(back.oldest.preferred_batch_size) == [2, 4]
    assert back.control_input[0].name == "START"
    assert list(back.control_input[0].control[0].int32_false_true) == [0, 1]
    assert [s.input_name for s in back.state] == ["h", "c"]
    start, end = TRITON_SEQUENCE.index("  oldest {"), TRITON_SEQUENCE.index("  control")
    path.write_text(TRITON_SEQUENCE[:start] + "  direct { }\n" + TRITON_SEQUENCE[end:])
    direct = read_triton_config(path, "seq")
    assert direct.sequence is not None and direct.sequence.strategy == "direct"
    assert direct.sequence.slots(max_batch_size=4, instances=2) == 8  # max_batch_size each
    assert direct.sequence.slots(max_batch_size=0, instances=3) == 3  # at least 1 each


@pytest.mark.parametrize(
    ("data_file", "size", "reason"),
    [
        ("c0", 4, "holds 4 bytes; dims [2] of FP32 need 8"),
        ("missing", 8, "no such file in the model's initial_state folder"),
        ("../c0", 8, "must name a file in the model's initial_state folder"),
    ],
)
def test_an_initial_state_file_that_cannot_be_read_as_declared_fails_the_model(
    tmp_path: Path, data_file: str, size: int, reason: str
) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text(TRITON_SEQUENCE.replace('data_file: "c0"', f'data_file: "{data_file}"'))
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "c0").write_bytes(bytes(size))
    (tmp_path / "c0").write_bytes(bytes(8))  # beside the folder, not in it
    with pytest.raises(ValueError, match=re.escape(reason)):
        read_triton_config(path, "seq")


def test_default_model_filename_names_the_graph_in_each_version(tmp_path: Path) -> None:
    demo.make_add_sub(tmp_path / "custom")
    (tmp_path / "custom" / "1" / "model.onnx").rename(tmp_path / "custom" / "1" / "graph.onnx")
    (tmp_path / "custom" / "config.pbtxt").write_text('default_model_filename: "graph.onnx"\n')
    source = scan_model(tmp_path, "custom", ModelConfig())
    assert source is not None and source.path.name == "graph.onnx" and not source.config_error
    demo.make_add_sub(tmp_path / "elsewhere")  # holds model.onnx, names another
    (tmp_path / "elsewhere" / "config.pbtxt").write_text('default_model_filename: "x.onnx"\n')
    assert scan_model(tmp_path, "elsewhere", ModelConfig()) is None
    why = unservable(tmp_path)["elsewhere"]
    assert why == "no version folder holds a x.onnx (<version>/x.onnx)"
    (tmp_path / "elsewhere" / "config.pbtxt").write_text('default_model_filename: "../x"\n')
    said = re.escape("default_model_filename '../x' is not a file name")
    with pytest.raises(ValueError, match=said):
        read_triton_config(tmp_path / "elsewhere" / "config.pbtxt", "elsewhere")
