"""Triton's model_warmup: samples read and checked when the model is found, run on
the new session by every load that warms up (an explicit load here), and a sample
that fails fails the load, naming it, while every other model serves."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.triton_config import read_triton_config
from tests.conftest import ADMIN_TOKEN, start_agent
from tests.support.waiting import wait_until

SAMPLES = """
name: "m"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
]
model_warmup [
  {
    name: "from_file"
    batch_size: 4
    count: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "x" } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } }
  },
  {
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
"""


def write_model(directory: Path, config: str, values: np.ndarray | None = None) -> Path:
    demo.make_add_sub(directory)
    (directory / "config.pbtxt").write_text(config)
    (directory / "warmup").mkdir()
    x = np.arange(16, dtype=np.float32) if values is None else values
    (directory / "warmup" / "x").write_bytes(x.tobytes())
    return directory / "config.pbtxt"


def test_samples_read_as_triton_reads_them(tmp_path: Path) -> None:
    config = read_triton_config(write_model(tmp_path / "m", SAMPLES), "m")
    assert config.warnings == []
    first, second = config.warmup
    assert (first.name, first.batch_size, first.runs) == ("from_file", 4, 2)
    assert (second.name, second.runs) == ("#1", 1)  # unnamed; count 0 runs once
    arrays = first.arrays()
    assert arrays["INPUT0"].shape == (4, 16)  # one sample's values, repeated per row
    np.testing.assert_array_equal(
        arrays["INPUT0"], np.tile(np.arange(16, dtype=np.float32), (4, 1))
    )
    random = arrays["INPUT1"]
    assert random.dtype == np.float32 and ((random >= 0) & (random < 1)).all() and random.any()
    assert not second.arrays()["INPUT0"].any()
    assert first.config_json()["inputs"]["INPUT0"]["input_data_file"] == "x"
    assert second.config_json()["inputs"]["INPUT1"] == {
        "data_type": "TYPE_FP32",
        "dims": [16],
        "zero_data": True,
    }


ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ONE_INPUT = 'inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }'


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (("batch_size: 4", "batch_size: 0"), "'from_file': batch_size must be at least 1"),
        (("batch_size: 4", "batch_size: 9"), "'from_file': batch_size 9 is above max_batch_size"),
        (("max_batch_size: 8", "max_batch_size: 0"), "must be 1 for a model that does not batch"),
        (('key: "INPUT1"', 'key: "INPUT2"'), "input 'INPUT2' is not an input of the model"),
        (("TYPE_FP32 dims: [ 16 ] random", "TYPE_INT32 dims: [ 16 ] random"), "is not the input's"),
        (("TYPE_FP32 dims: [ 16 ] random", "TYPE_FP32 dims: [ 8 ] random"), "do not fit"),
        (("TYPE_FP32 dims: [ 16 ] random", "TYPE_FP32 dims: [ -1 ] random"), "must be fixed"),
        (('input_data_file: "x"', 'input_data_file: "../x"'), "must name a file in the model's"),
        (('input_data_file: "x"', 'input_data_file: "y"'), "no such file in the model's warmup"),
    ],
)
def test_a_sample_that_cannot_run_as_written_fails_the_model(
    tmp_path: Path, edit: tuple[str, str], error: str
) -> None:
    path = write_model(tmp_path / "m", SAMPLES.replace(*edit, 1))
    with pytest.raises(ValueError, match=re.escape(error)):
        read_triton_config(path, "m")


def test_a_sample_missing_an_input_or_holding_the_wrong_bytes_fails_the_model(
    tmp_path: Path,
) -> None:
    missing = SAMPLES.replace(ONE_INPUT.replace("INPUT0", "INPUT1"), "")
    with pytest.raises(ValueError, match="'#1': no data for input 'INPUT1'"):
        read_triton_config(write_model(tmp_path / "a", missing), "m")
    short = np.arange(8, dtype=np.float32)
    with pytest.raises(ValueError, match=re.escape("holds 32 bytes; dims [16] of FP32 need 64")):
        read_triton_config(write_model(tmp_path / "b", SAMPLES, short), "m")


def test_an_explicit_load_runs_the_samples_and_one_that_fails_fails_the_load(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    write_model(repo / "warm", SAMPLES.replace('name: "m"', 'name: "warm"'))
    # No interface declared: the graph has the last word, at the load, when the
    # sample's INPUT0 of 8 values meets the graph's 16.
    undeclared = re.sub(r"input \[.*?\]\n", "", SAMPLES, flags=re.S)
    write_model(repo / "cold", undeclared.replace('name: "m"', 'name: "cold"'))
    config = repo / "cold" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 16 ] zero", "dims: [ 8 ] zero"))
    demo.make_add_sub(repo / "other")
    agent = start_agent(repo, tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url)
        a = np.ones((1, 16), np.float32)
        inputs = [th.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in (0, 1)]
        for item in inputs:
            item.set_data_from_numpy(a)
        client.load_model("warm", headers=ADMIN)
        assert client.is_model_ready("warm")
        np.testing.assert_array_equal(client.infer("warm", inputs).as_numpy("OUTPUT0"), a + a)
        samples = client.get_model_config("warm")["model_warmup"]
        assert [(s["name"], s["batch_size"], s["count"]) for s in samples] == [
            ("from_file", 4, 2),
            ("#1", 1, 1),
        ]
        with tg.InferenceServerClient(agent.grpc_url) as over:
            over_grpc = over.get_model_config("warm").config
        assert over_grpc.model_warmup[0].inputs["INPUT0"].input_data_file == "x"
        assert over_grpc.model_warmup[1].inputs["INPUT1"].zero_data
        with pytest.raises(InferenceServerException, match="model_warmup '#1' failed"):
            client.load_model("cold", headers=ADMIN)
        # The sample's file is read at each load: one removed since fails the next load.
        (repo / "warm" / "warmup" / "x").unlink()
        client.unload_model("warm", headers=ADMIN)
        gone = "model_warmup 'from_file': input 'INPUT0': input_data_file 'x': no such file"
        with pytest.raises(InferenceServerException, match=re.escape(gone)):
            client.load_model("warm", headers=ADMIN)
        assert not client.is_model_ready("cold")
        np.testing.assert_array_equal(client.infer("other", inputs).as_numpy("OUTPUT1"), a - a)
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'edgeplex_agent_promotion_stage_duration_seconds_count{stage="warmup"}' in metrics
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_an_idle_model_reloaded_after_its_runner_dies_runs_its_samples_again(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    write_model(repo / "warm", SAMPLES.replace('name: "m"', 'name: "warm"'))
    agent = start_agent(repo, tmp_path)

    def warm() -> dict | None:
        body = json.loads(agent.http_get("/edgeplex/v1/status")[1])
        (model,) = [m for m in body if m["name"] == "warm"]
        return model if model["state"] == "READY" else None

    try:
        client = th.InferenceServerClient(agent.http_url)
        client.load_model("warm", headers=ADMIN)
        before = wait_until(warm, what="the model ready")
        assert "warmup" in before["last_promotion"]["stages_ms"]
        os.kill(before["runner_pid"], signal.SIGKILL)
        after = wait_until(
            lambda: (m := warm()) and m["runner_pid"] != before["runner_pid"] and m,
            what="the model reloaded in a new runner",
        )
        # No request waited for it: its samples ran again before it served, and the
        # reload is not counted as a cold start.
        assert "warmup" in after["last_promotion"]["stages_ms"], after
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'edgeplex_agent_cold_starts_total{model="warm"}' not in metrics
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_samples_that_outlast_the_load_timeout_fail_it_and_free_the_loader(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    endless = SAMPLES.replace('name: "m"', 'name: "endless"').replace(
        "count: 2", "count: 1000000000"
    )
    write_model(repo / "endless", endless)
    demo.make_add_sub(repo / "other")
    env = {"EDGEPLEX_AGENT_RUNNER__LOAD_TIMEOUT_S": "1"}
    agent = start_agent(repo, tmp_path, env=env)
    try:
        client = th.InferenceServerClient(agent.http_url)
        # The agent's time limit or the runner's, whichever fires first: the same limit.
        with pytest.raises(InferenceServerException, match="did not finish"):
            client.load_model("endless", headers=ADMIN)
        started = time.monotonic()
        # The runner's one loader stopped the samples at the same time limit: free again.
        client.load_model("other", headers=ADMIN)
        assert time.monotonic() - started < 1.0
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


def test_string_samples_read_triton_s_length_prefixed_file(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    words = [b"edge", b"", b"plex"]
    (tmp_path / "warmup" / "words").write_bytes(
        b"".join(len(w).to_bytes(4, "little") + w for w in words)
    )
    config = (
        'name: "m"\nmax_batch_size: 4\n'
        'input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 3 ] } ]\n'
        'model_warmup [ { name: "words" batch_size: 2 inputs { key: "TEXT" value: '
        '{ data_type: TYPE_STRING dims: [ 3 ] input_data_file: "words" } } },\n'
        '  { name: "blank" batch_size: 1 inputs { key: "TEXT" value: '
        "{ data_type: TYPE_STRING dims: [ 3 ] random_data: true } } } ]\n"
    )
    (tmp_path / "config.pbtxt").write_text(config)
    words_sample, blank = read_triton_config(tmp_path / "config.pbtxt", "m").warmup
    assert words_sample.arrays()["TEXT"].tolist() == [words, words]  # repeated per row
    assert blank.arrays()["TEXT"].tolist() == [[b"", b"", b""]]  # random: empty, as Triton
    # Read when sent, not kept: a file broken since the model was found fails then.
    (tmp_path / "warmup" / "words").write_bytes((9).to_bytes(4, "little") + b"abc")
    with pytest.raises(ValueError, match="model_warmup 'words': input 'TEXT': input_data_file"):
        words_sample.arrays()
