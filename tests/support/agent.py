"""Asking a running agent (tests.conftest.AgentProcess) over HTTP: its status, its
memory, an admin verb, one inference of a 64-wide model."""

from __future__ import annotations

import json
import urllib.request

import numpy as np

from tests.conftest import AUTH


def status(agent) -> dict[str, dict]:
    return {m["name"]: m for m in json.loads(agent.http_get("/edgeplex/v1/status")[1])}


def memory(agent) -> dict:
    return json.loads(agent.http_get("/edgeplex/v1/memory")[1])


def post(agent, path: str, body: dict | None = None) -> int:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(
        f"http://{agent.http_url}{path}", data=data, method="POST", headers=AUTH
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def infer_http(agent, model: str) -> tuple[int, dict[str, str], dict]:
    x = np.ones((1, 64), np.float32)
    body = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}
            ]
        }
    ).encode()
    request = urllib.request.Request(
        f"http://{agent.http_url}/v2/models/{model}/infer", data=body, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())
