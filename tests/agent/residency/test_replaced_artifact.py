"""An artifact replaced under the same version is noticed: the staged copy of the
old one is dropped and the model serves the new one (staged copies are keyed by
what the artifact is, not by name and version)."""

from __future__ import annotations

import json
import os
import urllib.request

import numpy as np

from edgeplex.agent.catalog import demo
from tests.conftest import AUTH, start_agent


def infer(agent) -> list[float]:  # type: ignore[no-untyped-def]
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": [1.0] * 32}]}
    ).encode()
    request = urllib.request.Request(f"http://{agent.http_url}/v2/models/m/infer", data=body)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())["outputs"][0]["data"]


def test_a_replaced_artifact_is_served_after_a_reload(tmp_path):
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=32, seed=1)
    agent = start_agent(repo, tmp_path)
    try:
        before = infer(agent)
        fresh = tmp_path / "fresh"
        demo.make_mlp(fresh, width=64, layers=2, in_width=32, seed=2)
        target = repo / "m" / "1" / "model.onnx"
        os.replace(fresh / "1" / "model.onnx", target)  # same name, same version
        request = urllib.request.Request(
            f"http://{agent.http_url}/v2/repository/models/m/load",
            data=b"",
            headers=AUTH,
            method="POST",
        )
        urllib.request.urlopen(request, timeout=60).read()
        after = infer(agent)
        assert not np.allclose(before, after)
        status = json.loads(agent.http_get("/edgeplex/v1/status")[1])
        assert next(m for m in status if m["name"] == "m")["tier"] == "loaded"
    finally:
        assert agent.stop() == 0, agent.log()
