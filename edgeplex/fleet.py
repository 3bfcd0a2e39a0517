"""What the agent and the control plane share on the wire besides proto/: MQTT
topics, URLs and sessions, and the jittered backoff both use to reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt

from edgeplex.net import tcp_silence_options

TOPIC_ROOT = "edgeplex/v1"
T = TypeVar("T")


def desired_topic(site_id: str) -> str:
    return f"{TOPIC_ROOT}/sites/{site_id}/desired"


def presence_topic(site_id: str) -> str:
    return f"{TOPIC_ROOT}/sites/{site_id}/presence"


def routes_topic(region: str) -> str:
    return f"{TOPIC_ROOT}/regions/{region}/routes"


def key_topic() -> str:
    """Where a signed KeyRollover is retained for every site."""
    return f"{TOPIC_ROOT}/fleet/key"


@dataclass(frozen=True)
class MqttTarget:
    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool

    def client_kwargs(self, ca: Path | None = None) -> dict[str, object]:
        """aiomqtt.Client's arguments; with mqtts://, the broker's certificate is
        verified against `ca` (a PEM file) or else the system's CAs."""
        kwargs: dict[str, object] = {"hostname": self.host, "port": self.port}
        if self.username is not None:
            kwargs["username"] = self.username
            kwargs["password"] = self.password
        if self.tls:
            kwargs["tls_context"] = ssl.create_default_context(cafile=ca)
        return kwargs


# An MQTT connection pings after MQTT_KEEPALIVE_S with nothing sent or heard, and
# ends once a ping or a message it sent stays unacknowledged for MQTT_SILENCE_S: a
# connection that died silently (a NAT or firewall that dropped its state, a cut
# link) is found within about 15 s, not after paho's two keepalives of 60 s, while
# a desired state or a publish waits on it. The broker drops a client silent for
# 1.5 keepalives (15 s). A thousand sites ping a hundred times a second: nothing
# for a broker.
MQTT_KEEPALIVE_S = 10
MQTT_SILENCE_S = 4.0


@contextlib.asynccontextmanager
async def mqtt_session(**kwargs: Any) -> AsyncIterator[aiomqtt.Client]:
    """An aiomqtt client, connected for the block (`kwargs`: aiomqtt.Client's), with
    the fleet's keepalive and silence bound unless `kwargs` name their own.

    When the broker goes away and nothing reads or publishes after (the session
    ends as the process stops, say), aiomqtt 2.5 leaves its disconnect error in a
    future nobody reads, and asyncio logs "Future exception was never retrieved"
    at exit. The error is taken here: the block's own exception says what
    happened."""
    kwargs.setdefault("keepalive", MQTT_KEEPALIVE_S)
    kwargs.setdefault("socket_options", tcp_silence_options(MQTT_SILENCE_S))
    client = aiomqtt.Client(**kwargs)
    try:
        async with client:
            yield client
    finally:
        ended = getattr(client, "_disconnected", None)  # aiomqtt's own
        if isinstance(ended, asyncio.Future) and ended.done() and not ended.cancelled():
            ended.exception()


async def unless_lost(client: aiomqtt.Client, work: Awaitable[T]) -> T:
    """`work`'s result, or MqttError as soon as `client`'s connection is lost.

    aiomqtt leaves a publish waiting for its acknowledgement until its own timeout
    (10 s), however soon the connection that carried it died; and then waits as
    long again to disconnect from it. A connection found dead ends `work` (its
    publishes cancelled) at once."""
    task = asyncio.ensure_future(work)
    lost = getattr(client, "_disconnected", None)  # aiomqtt's own, as in mqtt_session
    if not isinstance(lost, asyncio.Future):
        return await task
    try:
        await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # its publishes forget the acknowledgements they awaited
    raise aiomqtt.MqttError("the connection to the broker was lost")


def parse_mqtt_url(url: str) -> MqttTarget:
    """mqtt://[user[:password]@]host[:port] (mqtts:// for TLS, default ports 1883/8883)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname:
        raise ValueError(f"not an MQTT URL: use mqtt://host:port (got scheme {parsed.scheme!r})")
    tls = parsed.scheme == "mqtts"
    return MqttTarget(
        host=parsed.hostname,
        port=parsed.port or (8883 if tls else 1883),
        username=urllib.parse.unquote(parsed.username) if parsed.username else None,
        password=urllib.parse.unquote(parsed.password) if parsed.password else None,
        tls=tls,
    )


class Backoff:
    """Full-jitter exponential backoff: delay() is uniform in [0, min(cap, base * 2**n)]
    with a floor, so a fleet of agents does not reconnect in lockstep."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 10.0, floor_s: float = 0.05) -> None:
        self.base_s, self.cap_s, self.floor_s = base_s, cap_s, floor_s
        self.attempts = 0

    def delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * 2**self.attempts)
        self.attempts += 1
        return max(self.floor_s, random.uniform(0, ceiling))

    def reset(self) -> None:
        self.attempts = 0
