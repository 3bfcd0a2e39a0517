"""The agent's admin surface: every mutating verb needs the admin token, on
loopback too, over HTTP and gRPC; without it the answer is 401 /
UNAUTHENTICATED and nothing changes. A generated token lands in a mode-0600
file; an inference key, when set, guards the inference routes; a non-loopback
bind without TLS is refused unless the agent is told --insecure."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.request

import grpc
import pytest

from edgeplex.proto import edgeplex_agent_pb2 as ctl
from edgeplex.proto import edgeplex_agent_pb2_grpc as ctl_grpc
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc
from tests.conftest import ADMIN_TOKEN, AUTH, free_port, start_agent

VERBS = [
    "/v2/repository/models/mlp_small/unload",
    "/v2/repository/models/mlp_small/load",
    "/edgeplex/v1/models/mlp_small/pin",
    "/edgeplex/v1/models/mlp_small/unpin",
    "/edgeplex/v1/models/mlp_small/demote",
]


def post(agent, path: str, headers: dict[str, str] | None = None, body: bytes = b""):
    request = urllib.request.Request(
        f"http://{agent.http_url}{path}", data=body, method="POST", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def tier(agent, model: str) -> str:
    status = json.loads(agent.http_get("/edgeplex/v1/status")[1])
    return next(m for m in status if m["name"] == model)["tier"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "x"}])
def test_http_verbs_without_the_token_get_401_and_change_nothing(agent, headers):
    before = tier(agent, "mlp_small")
    for path in VERBS:
        status, reply_headers, body = post(agent, path, headers)
        assert status == 401, (path, body)
        assert reply_headers.get("WWW-Authenticate") == "Bearer"
    assert tier(agent, "mlp_small") == before
    status, _, _ = post(agent, "/edgeplex/v1/models/mlp_small/pin", AUTH)
    assert status == 200
    assert post(agent, "/edgeplex/v1/models/mlp_small/unpin", AUTH)[0] == 200


def test_grpc_verbs_without_the_token_are_unauthenticated(agent):
    with grpc.insecure_channel(agent.grpc_url) as channel:
        control = ctl_grpc.AgentControlStub(channel)
        oip = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            lambda md: control.Pin(ctl.ModelRef(name="mlp_small"), metadata=md),
            lambda md: control.Unpin(ctl.ModelRef(name="mlp_small"), metadata=md),
            lambda md: control.Demote(ctl.DemoteRequest(name="mlp_small"), metadata=md),
            lambda md: oip.RepositoryModelUnload(
                pb.RepositoryModelUnloadRequest(model_name="mlp_small"), metadata=md
            ),
        ]
        for call in calls:
            for metadata in ((), (("authorization", "Bearer nope"),)):
                with pytest.raises(grpc.RpcError) as err:
                    call(metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        control.Pin(
            ctl.ModelRef(name="mlp_small"), metadata=(("authorization", AUTH["authorization"]),)
        )
        control.Unpin(
            ctl.ModelRef(name="mlp_small"), metadata=(("authorization", AUTH["authorization"]),)
        )
        # reads stay open without an inference key
        assert oip.ServerLive(pb.ServerLiveRequest()).live


def test_generated_token_file_and_inference_key(model_repo, tmp_path):
    token_file = tmp_path / "state" / "admin-token"
    agent = start_agent(
        model_repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": "",
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN_FILE": str(token_file),
            "EDGEPLEX_AGENT_SECURITY__INFERENCE_API_KEY": "client-key",
        },
    )
    try:
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32 and token != ADMIN_TOKEN
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 32], "datatype": "FP32", "data": [0] * 32}]}
        ).encode()
        path = "/v2/models/mlp_small/infer"
        assert post(agent, path, body=body)[0] == 401
        assert post(agent, path, {"Authorization": "Bearer client-key"}, body)[0] in (200, 400)
        assert post(agent, path, {"Authorization": f"Bearer {token}"}, body)[0] in (200, 400)
        pin = "/edgeplex/v1/models/mlp_small/pin"
        assert post(agent, pin, {"Authorization": "Bearer client-key"})[0] == 403
        assert post(agent, pin, {"Authorization": f"Bearer {token}"})[0] == 200
        assert agent.http_get("/v2/health/ready")[0] == 200  # health stays open
        assert agent.http_get("/metrics")[0] == 200
    finally:
        assert agent.stop() == 0, agent.log()


def test_non_loopback_bind_without_tls_is_refused(model_repo, tmp_path):
    command = [sys.executable, "-m", "edgeplex", "agent", "--model-repo", str(model_repo),
               "--grpc-host", "0.0.0.0", "--grpc-port", str(free_port()),
               "--http-port", str(free_port())]  # fmt: skip
    env = {**os.environ, "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": ADMIN_TOKEN}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "without TLS" in result.stderr + result.stdout
