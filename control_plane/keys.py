"""Rotating the key that signs control messages.

`edgeplex control-plane --rotate-signing-key NEW` creates NEW (mode 0600) if
it does not exist, and publishes a `KeyRollover` naming it, signed by the
current key and retained on the fleet's key topic. Every agent that trusts the
current key switches to NEW. Then give every replica NEW as its
`signing_key_file` and restart them (docs/security.md).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from edgeplex.control_plane.config import ControlPlaneSettings
from edgeplex.fleet import key_topic, mqtt_session, parse_mqtt_url
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.settings import state_dir
from edgeplex.signing import ROLLOVER, Signer

ROLLOVER_TTL_S = 30 * 24 * 3600.0  # agents offline for up to a month still switch


def rotate(settings: ControlPlaneSettings, new_file: Path) -> Signer:
    current = Signer.from_file(settings.signing_key_file or state_dir() / "signing-key")
    new = Signer.from_file(new_file)
    if new.key_id == current.key_id:
        raise ValueError(f"{new_file} holds the current key")
    payload = pb.KeyRollover(key_id=new.key_id, public_key=new.public).SerializeToString()
    sealed = current.seal(ROLLOVER, "fleet", time.time_ns() // 1000, payload, ROLLOVER_TTL_S)

    async def publish() -> None:
        kwargs = parse_mqtt_url(settings.mqtt_url).client_kwargs(settings.mqtt_tls_ca)
        async with mqtt_session(**kwargs) as client:
            await client.publish(key_topic(), sealed, qos=1, retain=True)

    asyncio.run(publish())
    return new
