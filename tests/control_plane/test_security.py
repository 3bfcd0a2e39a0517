"""Security baseline: mTLS on the agent link, MQTT passwords, loopback binds."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiomqtt
import grpc
import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeplex.control_plane.config import ControlPlaneSettings
from edgeplex.control_plane.publisher import Publisher
from edgeplex.fleet import parse_mqtt_url
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.rig.certs import issue
from edgeplex.signing import DESIRED, Signer, TrustStore
from tests.conftest import start_agent
from tests.services import ControlPlane, Mosquitto, RedisServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA (trust/ca.pem), a server certificate for 127.0.0.1 (server/) and a client
    certificate naming the site tls1 (tls1/), made as the compose rig makes its own."""
    d = tmp_path_factory.mktemp("pki")
    issue(d, "server", ["127.0.0.1", "localhost"])
    issue(d, "tls1", ["tls1"])
    return d


def test_agent_link_with_mutual_tls(pki: Path, tmp_path: Path) -> None:
    r = RedisServer(tmp_path)
    r.start()
    m = Mosquitto(tmp_path)
    m.start()
    cp = ControlPlane(
        tmp_path, r, m.url(),
        EDGEPLEX_CP_TLS_CERT=str(pki / "server" / "cert.pem"),
        EDGEPLEX_CP_TLS_KEY=str(pki / "server" / "key.pem"),
        EDGEPLEX_CP_TLS_CLIENT_CA=str(pki / "trust" / "ca.pem"),
    )  # fmt: skip
    cp.start()
    repo = tmp_path / "repo"
    repo.mkdir()
    agent = None
    try:
        register = pb.RegisterRequest(site_id="x1", region="a", address="127.0.0.1:1")
        # Without a client certificate the handshake fails.
        creds = grpc.ssl_channel_credentials((pki / "trust" / "ca.pem").read_bytes())
        with grpc.secure_channel(cp.address, creds) as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.AgentServiceStub(channel).Register(register, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # Plaintext is refused too.
        with grpc.insecure_channel(cp.address) as channel, pytest.raises(grpc.RpcError):
            pb_grpc.AgentServiceStub(channel).Register(register, timeout=5)
        agent = start_agent(
            repo,
            tmp_path,
            env={
                "EDGEPLEX_AGENT_FLEET__CONTROL_PLANE": cp.address,
                "EDGEPLEX_AGENT_FLEET__SITE_ID": "tls1",
                "EDGEPLEX_AGENT_FLEET__REGION": "a",
                "EDGEPLEX_AGENT_FLEET__MQTT_URL": m.url(),
                "EDGEPLEX_AGENT_FLEET__TLS_CA": str(pki / "trust" / "ca.pem"),
                "EDGEPLEX_AGENT_FLEET__TLS_CERT": str(pki / "tls1" / "cert.pem"),
                "EDGEPLEX_AGENT_FLEET__TLS_KEY": str(pki / "tls1" / "key.pem"),
            },
        )
        client = redis.Redis.from_url(r.url)
        wait_until(lambda: client.hexists("edgeplex:sites", "tls1"), what="agent registered")
        assert not client.hexists("edgeplex:sites", "x1")
    finally:
        if agent is not None:
            agent.stop()
        cp.stop()
        m.stop()
        r.stop()


def test_mqtt_username_and_password(tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "cp", "s3cret"], check=True)
    subprocess.run(["mosquitto_passwd", "-b", str(passwords), "s1", "s1-secret"], check=True)
    passwords.chmod(0o600)
    broker = Mosquitto(tmp_path, password_file=passwords)
    broker.start()

    async def scenario() -> None:
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(**parse_mqtt_url(broker.url("cp", "wrong")).client_kwargs()):  # type: ignore[arg-type]
                pass
        signer = Signer(Ed25519PrivateKey.generate())
        publisher = Publisher(broker.url("cp", "s3cret"), "test-cp", signer, 600)
        publisher.set_active(True)  # as the leading replica
        task = asyncio.create_task(publisher.run())
        publisher.publish("edgeplex/v1/sites/s1/desired", DESIRED, "site/s1", 1, b"payload")
        for _ in range(100):  # subscribe after the publish, so the broker's retained copy arrives
            if publisher.published:
                break
            await asyncio.sleep(0.05)
        async with aiomqtt.Client(
            **parse_mqtt_url(broker.url("s1", "s1-secret")).client_kwargs()
        ) as c:  # type: ignore[arg-type]
            await c.subscribe("edgeplex/v1/sites/s1/desired", qos=1)
            message = await asyncio.wait_for(anext(aiter(c.messages)), 10)
            assert message.retain
            trust = TrustStore()
            assert trust.pin(signer.public)
            assert trust.open(bytes(message.payload), DESIRED, "site/s1").payload == b"payload"
        task.cancel()

    try:
        asyncio.run(scenario())
    finally:
        broker.stop()


def test_everything_binds_to_loopback_by_default() -> None:
    from edgeplex.agent.config import AgentSettings

    cp = ControlPlaneSettings(admin_token="x")
    agent = AgentSettings()
    assert cp.grpc_host == cp.http_host == "127.0.0.1"
    assert agent.grpc_host == agent.http_host == "127.0.0.1"


def test_admin_cli_never_sends_its_token_in_clear_text_beyond_loopback() -> None:
    import os
    import sys

    env = {**os.environ, "EDGEPLEX_ADMIN_TOKEN": "secret"}
    command = [sys.executable, "-m", "edgeplex", "admin", "--control-plane", "192.0.2.1:7070"]
    result = subprocess.run(
        [*command, "site", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "clear text" in result.stderr and "secret" not in result.stderr


def test_agents_serve_tls_and_forward_to_peers_over_it(pki: Path, tmp_path: Path) -> None:
    """Both OIP ports on TLS, and a request forwarded across regions goes over TLS."""
    import json
    import ssl
    import urllib.request

    from edgeplex.agent.catalog import demo
    from tests.support.fleet import agent_tier, running_fleet

    tls = {
        "EDGEPLEX_AGENT_SECURITY__TLS_CERT": str(pki / "server" / "cert.pem"),
        "EDGEPLEX_AGENT_SECURITY__TLS_KEY": str(pki / "server" / "key.pem"),
        "EDGEPLEX_AGENT_FLEET__PEER_TLS_CA": str(pki / "trust" / "ca.pem"),
    }
    with running_fleet(tmp_path) as fleet:
        a1 = fleet.start_agent("a1", "a", tls, tls_ca=pki / "trust" / "ca.pem")
        b1 = fleet.start_agent("b1", "b", tls, tls_ca=pki / "trust" / "ca.pem")
        demo.make_mlp(tmp_path / "src" / "b_only", width=64, layers=2, in_width=32)
        fleet.add_model(
            "b_only",
            tmp_path / "src" / "b_only" / "1" / "model.onnx",
            regions=["b"],
            min_replicas=1,
        )
        wait_until(lambda: agent_tier(b1, "b_only") == "loaded", 40, what="b_only at b1")
        context = ssl.create_default_context(cafile=str(pki / "trust" / "ca.pem"))
        body = json.dumps(
            {"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": [1] * 32}]}
        ).encode()

        def served_by() -> str:
            url = f"https://{a1.http_url}/v2/models/b_only/infer"
            with urllib.request.urlopen(url, data=body, timeout=10, context=context) as reply:
                return reply.headers["edgeplex-served-by"]

        assert wait_until(lambda: served_by() == "b1", 40, what="a1 forwards to b1 over TLS")
        with pytest.raises(OSError):  # clear text is not served
            urllib.request.urlopen(f"http://{a1.http_url}/v2/health/ready", timeout=5)
        creds = grpc.ssl_channel_credentials((pki / "trust" / "ca.pem").read_bytes())
        with grpc.secure_channel(a1.grpc_url, creds) as channel:
            from edgeplex.proto import inference_pb2 as ipb
            from edgeplex.proto import inference_pb2_grpc as ipb_grpc

            live = ipb_grpc.GRPCInferenceServiceStub(channel).ServerLive(ipb.ServerLiveRequest())
            assert live.live
