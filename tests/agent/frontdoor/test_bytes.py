"""BYTES (string) tensors in and out, over gRPC and HTTP (JSON and binary), as
Triton encodes them, through a real agent and runner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.tensors import decode_bytes, encode_bytes, from_list
from edgeplex.agent.runners import framing
from tests.conftest import start_agent

WORDS = np.array([["héllo", "wörld", ""], ["a", "bb", "ccc"]], dtype=object)


def make_text_model(directory: Path) -> None:
    """OUT = Identity(TEXT) and LEN = the count of TEXT's elements, TEXT a string
    tensor [batch, n]."""
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["TEXT"], ["OUT"]),
            helper.make_node("Size", ["TEXT"], ["LEN"]),
        ],
        "text",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", "n"])],
        [
            helper.make_tensor_value_info("OUT", TensorProto.STRING, ["batch", "n"]),
            helper.make_tensor_value_info("LEN", TensorProto.INT64, []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (directory / "1").mkdir(parents=True)
    save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.yaml").write_text("max_batch_size: 0\n")


def test_bytes_codec_round_trips_and_refuses_what_is_malformed() -> None:
    raw = encode_bytes(WORDS)
    back = decode_bytes("t", [2, 3], raw, 1 << 20)
    assert back.tolist() == [[w.encode() for w in row] for row in WORDS.tolist()]
    for bad, why in (
        (raw[:-1], "runs past"),
        (raw + b"\x01\x00", "ends inside"),
        (raw + b"\x00\x00\x00\x00", "needs 6 BYTES elements"),
        (b"\x02\x00\x00\x00\xff\xfe" * 6, "not UTF-8"),
    ):
        with pytest.raises(InvalidInput, match=why):
            decode_bytes("t", [2, 3], bad, 1 << 20)
    with pytest.raises(InvalidInput, match="must be strings"):
        from_list("t", "BYTES", [1], [3], 1 << 20)
    descs, buffers = framing.pack_tensors({"t": back})
    payload = memoryview(b"".join(bytes(b) for b in buffers))
    assert framing.unpack_tensors(descs, payload)["t"].tolist() == back.tolist()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("bytes")
    make_text_model(root / "repo" / "text")
    process = start_agent(root / "repo", root)
    yield process
    assert process.stop() == 0, process.log()


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_over_http(agent, binary: bool) -> None:  # type: ignore[no-untyped-def]
    client = th.InferenceServerClient(agent.http_url)
    assert client.get_model_metadata("text")["inputs"][0]["datatype"] == "BYTES"
    tensor = th.InferInput("TEXT", [2, 3], "BYTES")
    tensor.set_data_from_numpy(WORDS, binary_data=binary)
    outputs = [th.InferRequestedOutput("OUT", binary_data=binary), th.InferRequestedOutput("LEN")]
    result = client.infer("text", [tensor], outputs=outputs)
    got = result.as_numpy("OUT")
    decoded = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in got.tolist()]
    assert decoded == WORDS.tolist()
    assert result.as_numpy("LEN").reshape(-1).tolist() == [6]


def test_bytes_over_grpc(agent) -> None:  # type: ignore[no-untyped-def]
    client = tg.InferenceServerClient(agent.grpc_url)
    tensor = tg.InferInput("TEXT", [2, 3], "BYTES")
    tensor.set_data_from_numpy(WORDS)
    result = client.infer("text", [tensor])
    assert [[v.decode() for v in row] for row in result.as_numpy("OUT").tolist()] == WORDS.tolist()


def test_a_bad_bytes_tensor_gets_a_clear_400(agent) -> None:  # type: ignore[no-untyped-def]
    client = th.InferenceServerClient(agent.http_url)
    tensor = th.InferInput("TEXT", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe", b"ok"]], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException, match="not UTF-8"):
        client.infer("text", [tensor])
    good = th.InferInput("TEXT", [1, 1], "BYTES")
    good.set_data_from_numpy(np.array([["still serving"]], dtype=object))
    assert client.infer("text", [good]).as_numpy("OUT")[0, 0] == b"still serving"
