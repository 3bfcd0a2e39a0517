"""config.pbtxt's `reshape`: clients send and receive a tensor's `dims`, the graph
takes and gives `reshape.shape`, as in Triton; batched requests keep their rows."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
import tritonclient.http.aio as tha
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.triton_config import read_triton_config
from tests.conftest import AUTH, start_agent

SQUARE = """
name: "square"
max_batch_size: 8
input [
  {
    name: "INPUT", data_type: TYPE_FP32, format: FORMAT_NCHW,
    dims: [ 2, 2 ], reshape: { shape: [ 4 ] }
  }
]
output [ { name: "OUTPUT", data_type: TYPE_FP32, dims: [ 2, 2 ], reshape: { shape: [ 4 ] } } ]
dynamic_batching { max_queue_delay_microseconds: 50000 }
"""


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (("shape: [ 4 ]", "shape: [ 5 ]"), "reshape [5] does not hold the elements of dims [2, 2]"),
        (("shape: [ 4 ]", "shape: [ -1, -1 ]"), "may have one variable dimension"),
        (("dims: [ 2, 2 ]", "dims: [ -1 ]"), "must both be fixed or both variable"),
    ],
)
def test_a_reshape_that_cannot_hold_the_dims_is_an_error(
    tmp_path: Path, edit: tuple[str, str], error: str
) -> None:
    (tmp_path / "config.pbtxt").write_text(SQUARE.replace(*edit, 1))
    with pytest.raises(ValueError, match=re.escape(error)):
        read_triton_config(tmp_path / "config.pbtxt", "square")


def test_clients_see_dims_and_the_graph_its_reshape(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_identity(repo / "square", "FP32", width=4)
    (repo / "square" / "config.pbtxt").write_text(SQUARE)
    demo.make_identity(repo / "wrong", "FP32", width=4)  # the graph takes 4, not 6
    four = "dims: [ 2, 2 ], reshape: { shape: [ 4 ] }"
    six = "dims: [ 2, 3 ], reshape: { shape: [ 6 ] }"
    wrong = SQUARE.replace('"square"', '"wrong"').replace(four, six, 1)
    (repo / "wrong" / "config.pbtxt").write_text(wrong)
    # Warm-up samples are written in the clients' dims, and reshaped as requests are.
    demo.make_identity(repo / "warm", "FP32", width=4)
    sample = (
        'model_warmup [ { name: "rows" batch_size: 3 inputs { key: "INPUT" value: '
        "{ data_type: TYPE_FP32 dims: [ 2, 2 ] random_data: true } } } ]\n"
    )
    (repo / "warm" / "config.pbtxt").write_text(SQUARE.replace('"square"', '"warm"') + sample)
    agent = start_agent(repo, tmp_path)
    try:
        client = th.InferenceServerClient(agent.http_url)
        meta = client.get_model_metadata("square")
        assert meta["inputs"][0]["shape"] == [-1, 2, 2]
        assert meta["outputs"][0]["shape"] == [-1, 2, 2]
        config = client.get_model_config("square")
        assert config["input"][0]["dims"] == [2, 2]
        assert config["input"][0]["reshape"] == {"shape": [4]}
        assert config["input"][0]["format"] == "FORMAT_NCHW"  # for clients, as Triton's

        async def side_by_side() -> list[np.ndarray]:
            """Requests of 1, 2 and 3 rows, batched together by the model's delay."""
            async with tha.InferenceServerClient(agent.http_url) as aio:
                calls = []
                for rows in (1, 2, 3):
                    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 2, 2) + 10 * rows
                    tensor = tha.InferInput("INPUT", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    calls.append(aio.infer("square", [tensor]))
                return [r.as_numpy("OUTPUT") for r in await asyncio.gather(*calls)]

        for rows, out in zip((1, 2, 3), asyncio.run(side_by_side()), strict=True):
            expected = np.arange(rows * 4, dtype=np.float32).reshape(rows, 2, 2) + 10 * rows
            np.testing.assert_array_equal(out, expected)
        stats = client.get_inference_statistics("square")["model_stats"][0]
        # Six rows in three requests, run in fewer executions: batched together.
        assert stats["inference_count"] == 6 and stats["execution_count"] < 3, stats
        flat = th.InferInput("INPUT", [1, 4], "FP32")  # the graph's shape, not the clients'
        flat.set_data_from_numpy(np.zeros((1, 4), np.float32))
        with pytest.raises(InferenceServerException, match="INPUT"):
            client.infer("square", [flat])
        client.load_model("warm", headers=AUTH)  # a load that warms up
        assert client.is_model_ready("warm")
        assert not client.is_model_ready("wrong")
        status = {m["name"]: m for m in client.get_model_repository_index()}
        assert "reshape [6]" in status["wrong"]["reason"], status["wrong"]
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()
