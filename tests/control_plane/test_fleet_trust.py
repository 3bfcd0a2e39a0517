"""Fleet trust end to end: forged MQTT control messages change nothing at a site
and are counted; a site proves who it is before it may register or report;
hop headers count only from fleet peers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import aiomqtt
import grpc
import numpy as np
import pytest
import redis
import tritonclient.http as triton_http
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeplex.agent.catalog import demo
from edgeplex.fleet import desired_topic, parse_mqtt_url, routes_topic
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.signing import DESIRED, ROUTES, Signer, key_id, region_audience, site_audience
from tests.services import TOKEN, join_token
from tests.support.fleet import Fleet, agent_tier, rejected_messages, running_fleet
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("trust")
    with running_fleet(workdir) as f:
        demo.make_mlp(workdir / "src" / "base", width=64, layers=2, in_width=32)
        f.start_agent("a1", "a", {"EDGEPLEX_AGENT_FLEET__ARTIFACT_DEADLINE_S": "3"})
        f.add_model("base", workdir / "src" / "base" / "1" / "model.onnx", min_replicas=1)
        yield f


def publish(fleet: Fleet, topic: str, payloads: list[bytes]) -> None:
    async def send() -> None:
        kwargs = parse_mqtt_url(fleet.mqtt.url()).client_kwargs()
        async with aiomqtt.Client(**kwargs) as client:  # type: ignore[arg-type]
            for payload in payloads:  # not retained: the real retained copy stays
                await client.publish(topic, payload, qos=1)

    asyncio.run(send())


def test_forged_control_messages_change_nothing_and_are_counted(fleet: Fleet) -> None:
    agent = fleet.agents["a1"]
    wait_until(lambda: agent_tier(agent, "base") == "loaded", 40, what="base loaded at a1")
    before = rejected_messages(agent)
    empty = pb.DesiredState(version=2**64 - 1, site_id="a1").SerializeToString()
    attacker = Signer(Ed25519PrivateKey.generate())
    legit = Signer.from_file(fleet.workdir / "signing-key")  # the real key, misused
    forged = [
        empty,  # unsigned
        attacker.seal(DESIRED, site_audience("a1"), 2**64 - 1, empty, 600),  # another key
        legit.seal(DESIRED, site_audience("b9"), 2**63, empty, 600),  # another site's
        legit.seal(DESIRED, site_audience("a1"), 2**63, empty, -5),  # expired
        legit.seal(DESIRED, site_audience("a1"), 1, empty, 600),  # replayed: an old version
        legit.seal(ROUTES, site_audience("a1"), 2**63, empty, 600),  # wrong kind
    ]
    publish(fleet, desired_topic("a1"), forged)
    routes = pb.Routes(version=2**63, region="a").SerializeToString()
    publish(
        fleet, routes_topic("a"), [attacker.seal(ROUTES, region_audience("a"), 2**63, routes, 600)]
    )
    wait_until(
        lambda: rejected_messages(agent) >= before + len(forged) + 1, what="all forgeries rejected"
    )
    assert agent_tier(agent, "base") == "loaded"
    # The real control plane still commands the site afterwards.
    demo.make_mlp(fleet.workdir / "src" / "late", width=64, layers=2, in_width=32, seed=4)
    fleet.add_model("late", fleet.workdir / "src" / "late" / "1" / "model.onnx", min_replicas=1)
    wait_until(lambda: agent_tier(agent, "late") == "loaded", 40, what="a real update applied")


def test_sites_prove_who_they_are(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis.url)
    address_before = client.hget("edgeplex:sites", "a1")
    other = join_token(fleet.cp, "x9", "a")  # a site that may join, but is not a1

    def register(site: str, region: str, token: str | None, address: str = "10.9.9.9:8001"):  # type: ignore[no-untyped-def]
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        request = pb.RegisterRequest(site_id=site, region=region, address=address)
        with (
            grpc.insecure_channel(fleet.cp.address) as channel,
            pytest.raises(grpc.RpcError) as err,
        ):
            pb_grpc.AgentServiceStub(channel).Register(request, metadata=metadata, timeout=10)
        return err.value.code()

    assert register("a1", "a", None) == grpc.StatusCode.UNAUTHENTICATED
    assert register("a1", "a", "ejt_made-up") == grpc.StatusCode.UNAUTHENTICATED
    assert register("a1", "a", other) == grpc.StatusCode.PERMISSION_DENIED  # x9's token
    assert register("x9", "b", other) == grpc.StatusCode.PERMISSION_DENIED  # wrong region
    assert register("x9", "a", other, "0.0.0.0:8001") == grpc.StatusCode.INVALID_ARGUMENT
    assert register("x9", "a", other, "[::]:8001") == grpc.StatusCode.INVALID_ARGUMENT
    with grpc.insecure_channel(fleet.cp.address) as channel, pytest.raises(grpc.RpcError) as err:
        reports = iter([pb.LoadReport(site_id="a1")])
        pb_grpc.AgentServiceStub(channel).Report(
            reports, metadata=(("authorization", f"Bearer {other}"),), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert client.hget("edgeplex:sites", "a1") == address_before
    assert not client.hexists("edgeplex:sites", "x9")


def test_site_add_writes_an_env_file_the_agent_joins_with(fleet: Fleet, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`admin site add --env-file` (systemd's EnvironmentFile, the compose rig):
    the credentials land in a 0600 file and nothing secret is printed."""
    env_file = tmp_path / "x8.env"
    command = [sys.executable, "-m", "edgeplex", "admin", "--control-plane", fleet.cp.address]
    result = subprocess.run(
        [*command, "site", "add", "x8", "--region", "a", "--env-file", str(env_file),
         "--mqtt-url", "mqtt://127.0.0.1:1883"],
        env={**os.environ, "EDGEPLEX_ADMIN_TOKEN": TOKEN},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert env_file.stat().st_mode & 0o777 == 0o600
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    token = values["EDGEPLEX_AGENT_FLEET__JOIN_TOKEN"]
    assert token not in result.stdout and token not in result.stderr
    assert values["EDGEPLEX_AGENT_FLEET__MQTT_URL"] == "mqtt://127.0.0.1:1883"  # no broker user
    request = pb.RegisterRequest(site_id="x8", region="a", address="127.0.0.1:9")
    with grpc.insecure_channel(fleet.cp.address) as channel:
        reply = pb_grpc.AgentServiceStub(channel).Register(
            request, metadata=(("authorization", f"Bearer {token}"),), timeout=10
        )
    assert reply.signing_key_id


def test_hop_headers_count_only_from_fleet_peers(fleet: Fleet) -> None:
    """A client cannot pose as a forwarding peer: its origin region is ignored."""
    agent = fleet.agents["a1"]
    wait_until(lambda: agent_tier(agent, "base") == "loaded", 40, what="base loaded at a1")
    client = triton_http.InferenceServerClient(agent.http_url)
    x = np.ones((1, 32), dtype=np.float32)
    inp = triton_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    spoof = {
        "edgeplex-origin-region": "zz",
        "edgeplex-forwarded": "evil",
        "edgeplex-peer-token": "x",
    }
    for _ in range(5):
        client.infer("base", [inp], headers=spoof)
    wait_until(lambda: fleet_demand_regions(fleet) >= {"a"}, what="demand reported")
    assert "zz" not in fleet_demand_regions(fleet)


def fleet_demand_regions(fleet: Fleet) -> set[str]:
    client = redis.Redis.from_url(fleet.redis.url)
    regions = set()
    for raw in client.hvals("edgeplex:reports"):
        report = pb.LoadReport.FromString(raw)
        for model in report.models:
            regions.update(model.rate_by_region)
    return regions


class Flaky(http.server.BaseHTTPRequestHandler):
    """Serves one artifact, ignoring Range: whole to the first caller (the control
    plane verifying it), then broken off midway, then dripping past the agent's
    deadline, then whole."""

    body = b""
    calls = 0
    ranges: list[str] = []

    def do_GET(self) -> None:
        Flaky.calls += 1
        Flaky.ranges.append(self.headers.get("Range", ""))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            if Flaky.calls == 2:
                self.wfile.write(self.body[:100])  # and hang up
            elif Flaky.calls == 3:
                for byte in self.body[:50]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            else:
                self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def test_failed_downloads_leave_a_reason_and_are_retried(fleet: Fleet) -> None:
    path = fleet.workdir / "src" / "flaky"
    demo.make_mlp(path, width=64, layers=2, in_width=32, seed=9)
    Flaky.body = (path / "1" / "model.onnx").read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    agent = fleet.agents["a1"]
    try:
        fleet.call(
            "AddModel",
            pb.CatalogModel(
                name="flaky",
                artifact_uri=f"http://127.0.0.1:{server.server_address[1]}/flaky.onnx",
                sha256=hashlib.sha256(Flaky.body).hexdigest(),
                min_replicas=1,
            ),
        )
        wait_until(lambda: agent_tier(agent, "flaky") == "loaded", 90, what="loaded at last")
    finally:
        server.shutdown()
    log = agent.log()
    # The broken-off download is tried again at once, asking to resume where it
    # stopped; the dripping one runs into the deadline, fails the model with that
    # reason, and the next reconcile fetches it whole.
    assert Flaky.ranges[1:3] == ["", "bytes=100-"], Flaky.ranges
    assert "model flaky: the download took longer than 3 s" in log
    assert Flaky.calls >= 4


def test_a_signed_rollover_moves_sites_to_the_new_key(fleet: Fleet) -> None:
    """Runs last: afterwards the site no longer trusts the running control plane's key."""
    agent = fleet.agents["a1"]
    trust_file = fleet.workdir / f"control-plane-{agent.grpc_port}.pub"
    old = trust_file.read_text()
    new_key = fleet.workdir / "new-signing-key"
    env = {**os.environ, "EDGEPLEX_CP_SIGNING_KEY_FILE": str(fleet.workdir / "signing-key")}
    result = subprocess.run(
        [sys.executable, "-m", "edgeplex", "control-plane", "--mqtt", fleet.mqtt.url(),
         "--rotate-signing-key", str(new_key)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    new = Signer.from_file(new_key)
    assert new.key_id in result.stdout
    expected = base64.b64encode(new.public).decode()
    wait_until(lambda: json.loads(trust_file.read_text())["key"] == expected, what="the switch")
    assert trust_file.read_text() != old
    old_id = key_id(base64.b64decode(json.loads(old)["key"]))
    assert json.loads(trust_file.read_text())["retired"] == [old_id]  # a restart knows


def test_versions_that_are_not_numbers_and_reserved_site_names_are_refused(fleet: Fleet) -> None:
    path = fleet.workdir / "src" / "base" / "1" / "model.onnx"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for version in ("../../x", "/etc/passwd", "1/2", "..", "0", "01", "v1"):
        model = pb.CatalogModel(
            name="evil", version=version, artifact_uri=path.as_uri(), sha256=digest
        )
        with pytest.raises(grpc.RpcError) as err:
            fleet.call("AddModel", model)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "version" in (err.value.details() or "")
    for site in ("edgeplex-cp", "edgeplex-anything", "EDGEPLEX-CP"):
        with pytest.raises(grpc.RpcError) as err:
            fleet.call("AddSite", pb.AddSiteRequest(site_id=site, region="a"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reserved" in (err.value.details() or "")
