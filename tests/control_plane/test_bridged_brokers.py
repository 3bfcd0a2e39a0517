"""Two brokers, bridged: the control plane publishes to its own broker, and a second
broker (nearer some sites, as a regional broker is) bridges the fleet's topics in.
Sites on either broker, each as its own broker user, receive every message meant for
them, retained ones included."""

from __future__ import annotations

import asyncio
import json
import shutil
import zlib
from pathlib import Path

import aiomqtt
import grpc

from edgeplex.control_plane.broker_files import acl_text, set_password
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.services import TOKEN, Bridge, ControlPlane, FleetBroker, RedisServer, wait_port

AUTH = (("authorization", f"Bearer {TOKEN}"),)
BRIDGE = "edgeplex-bridge-b"


def opened(payload: bytes) -> bytes:
    """A signed message's payload, inflated (signatures are the agents' tests')."""
    body = pb.SignedBody.FromString(pb.SignedMessage.FromString(payload).body)
    return zlib.decompress(body.payload) if body.encoding else body.payload


async def receive(port: int, user: str, password: str, topics: list[str], want: bytes,
                  timeout: float = 30.0) -> dict[str, bytes]:  # fmt: skip
    """Connect as `user`, subscribe to `topics`, and return each topic's first message
    whose payload holds `want`."""
    got: dict[str, bytes] = {}
    async with aiomqtt.Client("127.0.0.1", port, username=user, password=password,
                              identifier=user) as client:  # fmt: skip
        for topic in topics:
            await client.subscribe(topic, qos=1)

        async def collect() -> None:
            async for message in client.messages:
                payload = bytes(message.payload)  # type: ignore[arg-type]
                topic = str(message.topic)
                if topic not in got and (not want or want in opened(payload)):
                    got[topic] = payload
                if len(got) == len(topics):
                    return

        await asyncio.wait_for(collect(), timeout)
    return got


def test_sites_on_a_bridged_broker_receive_every_message(tmp_path: Path) -> None:
    if shutil.which("mosquitto_passwd") is None:
        raise AssertionError("mosquitto_passwd is missing: `make setup` installs it")
    files = tmp_path / "broker-files"
    files.mkdir()
    bridge_password = set_password(files / "passwd", BRIDGE)
    (files / "acl").write_text(acl_text({}, bridges=[BRIDGE]))
    first = FleetBroker(tmp_path / "a", files)
    first.start()
    redis = RedisServer(tmp_path)
    redis.start()
    cp_password = set_password(files / "passwd", "edgeplex-cp")
    cp = ControlPlane(
        tmp_path, redis, first.url("edgeplex-cp", cp_password),
        EDGEPLEX_CP_MQTT_PASSWORD_FILE=str(files / "passwd"),
        EDGEPLEX_CP_MQTT_ACL_FILE=str(files / "acl"),
        EDGEPLEX_CP_MQTT_PID_FILE=str(first.pid_file),
        EDGEPLEX_CP_MQTT_BRIDGE_USERS=json.dumps([BRIDGE]),
    )  # fmt: skip
    cp.start()
    second = FleetBroker(tmp_path / "b", files, bridge=Bridge(first.port, BRIDGE, bridge_password))
    try:
        sites = {}
        with grpc.insecure_channel(cp.address) as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            agents = pb_grpc.AgentServiceStub(channel)
            for i, broker in enumerate(("a", "a", "b", "b")):
                site = f"site-{broker}{i}"
                reply = admin.AddSite(pb.AddSiteRequest(site_id=site, region=f"r{i % 2}"),
                                      metadata=AUTH, timeout=10)  # fmt: skip
                agents.Register(
                    pb.RegisterRequest(site_id=site, region=f"r{i % 2}", address="127.0.0.1:1"),
                    metadata=(("authorization", f"Bearer {reply.join_token}"),), timeout=10,
                )  # fmt: skip
                sites[site] = (broker, reply.mqtt_password)
            # The second broker reads the files as the control plane left them (a
            # broker managed apart is reloaded by its own configuration management).
            second.start()
            wait_port(second.port)
            admin.AddTenant(pb.TenantSpec(name="bridged-probe"), metadata=AUTH, timeout=10)

        async def everyone() -> list[dict[str, bytes]]:
            calls = []
            for site, (broker, password) in sites.items():
                port = first.port if broker == "a" else second.port
                topics = [f"edgeplex/v1/sites/{site}/desired"]
                calls.append(receive(port, site, password, topics, b"bridged-probe"))
            return await asyncio.gather(*calls)

        # Each site, on either broker, has its desired state with the new tenant:
        # retained on the bridged broker too (these subscribers came after it).
        received = asyncio.run(everyone())
        for (site, _), got in zip(sites.items(), received, strict=True):
            state = pb.DesiredState.FromString(opened(got[f"edgeplex/v1/sites/{site}/desired"]))
            assert state.site_id == site and "bridged-probe" in state.tenants_json

    finally:
        second.stop()
        cp.stop()
        redis.stop()
        first.stop()
