"""The leader's publisher against a real mosquitto: many sites' desired states,
sent a window at a time (each window sealed while the one before is in flight),
all arrive signed and whole, and a second change of their heads alone arrives
as well."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiomqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeplex.control_plane.publisher import WINDOW, Publisher
from edgeplex.fleet import desired_topic, parse_mqtt_url
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.signing import DESIRED, Signer, TrustStore, site_audience
from tests.services import Mosquitto

SITES = 5 * WINDOW + 7  # several windows, the last one short


def models(site: int) -> bytes:
    """A site's models as a desired state carries them: a tail of a few KiB."""
    state = pb.DesiredState()
    for j in range(site % 7, 200, 7):
        uri = f"https://artifacts.example.com/m{j}/1/model.onnx"
        digest = hashlib.sha256(uri.encode()).hexdigest()
        state.models.add(name=f"m{j}", version="1", tier="staged", sha256=digest, artifact_uri=uri)
    return state.SerializeToString()


def head(site: int, version: int, tenants: str) -> bytes:
    return pb.DesiredState(
        version=version, site_id=f"s{site}", tenants_json=tenants
    ).SerializeToString()


def test_every_site_gets_every_change_a_window_at_a_time(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path)
    broker.start()
    signer = Signer(Ed25519PrivateKey.generate())
    tails = [models(i) for i in range(SITES)]

    async def scenario() -> None:
        publisher = Publisher(broker.url(), "test-cp", signer, 600)
        publisher.set_active(True)
        task = asyncio.create_task(publisher.run())
        async with aiomqtt.Client(**parse_mqtt_url(broker.url()).client_kwargs()) as client:  # type: ignore[arg-type]
            await client.subscribe("edgeplex/v1/sites/+/desired", qos=1)
            for version, tenants in ((1, "[]"), (2, '[{"name": "acme"}]')):
                for i in range(SITES):
                    publisher.publish(
                        desired_topic(f"s{i}"), DESIRED, site_audience(f"s{i}"), version,
                        head(i, version, tenants), tails[i],
                    )  # fmt: skip
                arrived: dict[str, bytes] = {}
                async with asyncio.timeout(30):
                    async for message in client.messages:
                        site = message.topic.value.split("/")[3]
                        trust = TrustStore()
                        assert trust.pin(signer.public)
                        opened = trust.open(bytes(message.payload), DESIRED, site_audience(site))  # type: ignore[arg-type]
                        if opened.version == version:
                            arrived[site] = opened.payload
                        if len(arrived) == SITES:
                            break
                for i in range(SITES):
                    assert arrived[f"s{i}"] == head(i, version, tenants) + tails[i]
        async with asyncio.timeout(10):  # its acknowledgements, each counted once
            while publisher.published < 2 * SITES:
                await asyncio.sleep(0.05)
        assert publisher.published == 2 * SITES
        task.cancel()

    try:
        asyncio.run(scenario())
    finally:
        broker.stop()
