"""The generated code in proto/ must equal a fresh run of scripts/gen_proto.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*_pb2*")}
    committed = {p.name: p.read_text() for p in (ROOT / "proto").glob("*_pb2*")}
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated code {stale}: run `make proto`"


def test_wire_compatible_with_tritonclient_messages():
    """Same field numbers as Triton's grpc_service.proto: bytes cross both ways."""
    from tritonclient.grpc import service_pb2 as triton

    from edgeplex.proto import inference_pb2 as ours

    request = triton.ModelInferRequest(model_name="m", model_version="2", id="r")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    request.parameters["timeout"].int64_param = 5
    request.outputs.add(name="y")
    request.raw_input_contents.append(b"abc")
    mine = ours.ModelInferRequest.FromString(request.SerializeToString())
    assert mine.model_name == "m" and mine.inputs[0].contents.fp32_contents == [1.0, 2.0]
    assert mine.parameters["timeout"].int64_param == 5 and mine.raw_input_contents == [b"abc"]

    stats = ours.ModelStatisticsResponse()
    model = stats.model_stats.add(name="m", inference_count=3, execution_count=2)
    model.inference_stats.queue.ns = 9
    model.batch_stats.add(batch_size=2).compute_infer.count = 1
    theirs = triton.ModelStatisticsResponse.FromString(stats.SerializeToString())
    assert theirs.model_stats[0].inference_stats.queue.ns == 9
    assert theirs.model_stats[0].batch_stats[0].batch_size == 2

    index = ours.RepositoryIndexResponse()
    index.models.add(name="m", version="1", state="FAILED", reason="bad")
    assert (
        triton.RepositoryIndexResponse.FromString(index.SerializeToString()).models[0].reason
        == "bad"
    )

    config = ours.ModelConfigResponse()
    config.config.max_batch_size = 8
    config.config.input.add(name="x", data_type=ours.TYPE_FP32, dims=[4])
    their_config = triton.ModelConfigResponse.FromString(config.SerializeToString()).config
    assert their_config.max_batch_size == 8 and list(their_config.input[0].dims) == [4]
    assert their_config.input[0].data_type == 11  # TYPE_FP32
