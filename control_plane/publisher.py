"""Desired state and routes out to the agents: signed, retained QoS 1 MQTT messages.

`publish()` only records the latest message per topic and wakes the task in
`run()`, which owns the MQTT connection. Each message is sealed (signed, with
its kind, audience, version and expiry; edgeplex/signing.py) when it is sent.
After every (re)connect the task sends the latest message of every topic
again, so a broker that lost its retained messages (restarted without
persistence) gets them back; and every third of the message lifetime it
re-seals and re-sends them all, so the retained copies never expire while this
replica leads.

A message may come as a head and a tail (a site's desired state: its version and
tenants, then its models). The tail is deflated apart and kept per topic, so a
change of the head alone, a tenant added at every site, re-seals a thousand
states in a tenth of the time (edgeplex/signing.py, deflate_joined).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import aiomqtt

from edgeplex.fleet import Backoff, mqtt_session, parse_mqtt_url, unless_lost
from edgeplex.signing import Signer, deflate_joined, raw_deflate

log = logging.getLogger("edgeplex.control_plane.publisher")


WINDOW = 64  # messages in flight to the broker at once (QoS 1, each acknowledged)
# The publisher is one client a fleet (the leader's), so it retries its broker
# often: desired state waits for it. Agents, a thousand to a broker, keep the wider
# spread of the default backoff.
RECONNECT_CAP_S = 2.0


@dataclass(frozen=True)
class Outgoing:
    kind: str
    audience: str
    version: int
    payload: bytes  # the head, when there is a tail
    tail: bytes = b""


class Publisher:
    def __init__(
        self,
        url: str,
        client_id: str,
        signer: Signer,
        ttl_s: float,
        ca: Path | None = None,
        compress: bool = True,
    ) -> None:
        self._target = parse_mqtt_url(url)
        self._compress = compress  # deflate payloads (edgeplex/signing.py)
        self._ca = ca
        self._client_id = client_id
        self._signer = signer
        self._ttl_s = ttl_s
        self._latest: dict[str, Outgoing] = {}
        self._pending: dict[str, Outgoing] = {}
        self._tails: dict[str, tuple[bytes, bytes]] = {}  # topic -> its tail, deflated
        self._wake = asyncio.Event()
        self._active = asyncio.Event()  # set while this replica leads
        self.connected = False
        self.published = 0

    def set_active(self, active: bool) -> None:
        """Connect only while this replica leads: the broker binds client ids to
        usernames, so the replicas' shared user holds one session, the leader's."""
        if active:
            self._active.set()
        else:
            self._active.clear()
            self._wake.set()  # a connected publisher sees it and disconnects

    def publish(
        self, topic: str, kind: str, audience: str, version: int, payload: bytes, tail: bytes = b""
    ) -> None:
        """Queue the newest message of `topic`, `payload + tail`; older unsent ones
        are dropped. Give what recurs from message to message as the tail."""
        message = Outgoing(kind, audience, version, payload, tail)
        if self._latest.get(topic) == message:
            return
        self._latest[topic] = message
        self._pending[topic] = message
        self._wake.set()

    def forget(self) -> None:
        """Stop republishing (this replica is no longer the leader). The deflated
        tails stay: they hold for the same bytes whoever leads, and a leader back
        after a lapse of its lease sends every site's state again."""
        self._latest.clear()
        self._pending.clear()

    def _seal(self, topic: str, message: Outgoing) -> bytes:
        deflated = None
        if message.tail and self._compress:
            kept = self._tails.get(topic)
            if kept is None or kept[0] != message.tail:
                kept = self._tails[topic] = (message.tail, raw_deflate(message.tail))
            deflated = deflate_joined(message.payload, message.tail, kept[1])
        return self._signer.seal(
            message.kind,
            message.audience,
            message.version,
            message.payload + message.tail,
            self._ttl_s,
            self._compress,
            deflated,
        )

    async def _send_all(self, client: aiomqtt.Client) -> None:
        """Every pending message, WINDOW at a time in flight together (one after
        another, a thousand sites' messages took a thousand broker round trips:
        about 10 s under load). Each window is sealed while the one before it is in
        flight. A message not acknowledged stays pending."""
        unacked: dict[str, Outgoing] = {}

        def take() -> list[tuple[str, Outgoing]]:
            batch = [self._pending.popitem() for _ in range(min(WINDOW, len(self._pending)))]
            unacked.update(batch)
            return batch

        batch = take()
        sealing: asyncio.Future[list[bytes]] | None = self._sealing(batch)
        try:
            while sealing is not None:
                sealed = await sealing
                following = take()
                sealing = self._sealing(following) if following else None
                await self._send_window(client, batch, sealed, unacked)
                batch = following
        finally:
            if sealing is not None:
                sealing.cancel()
            for topic, message in unacked.items():
                self._pending.setdefault(topic, message)

    def _sealing(self, batch: list[tuple[str, Outgoing]]) -> asyncio.Future[list[bytes]]:
        # In a thread: deflating and signing a thousand sites' states is seconds of
        # work, which the loop's other tasks (reports) need not wait out.
        return asyncio.ensure_future(
            asyncio.to_thread(lambda: [self._seal(t, m) for t, m in batch])
        )

    async def _send_window(
        self,
        client: aiomqtt.Client,
        batch: list[tuple[str, Outgoing]],
        sealed: list[bytes],
        unacked: dict[str, Outgoing],
    ) -> None:
        sends = asyncio.gather(
            *(
                client.publish(t, data, qos=1, retain=True)
                for (t, _), data in zip(batch, sealed, strict=True)
            ),
            return_exceptions=True,
        )
        results = await unless_lost(client, sends)
        failed = None
        for (topic, message), result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                failed = failed or result
                continue
            self.published += 1
            if unacked.get(topic) is message:  # not a newer one taken since
                del unacked[topic]
        if failed is not None:
            raise failed

    async def run(self) -> None:
        backoff = Backoff(cap_s=RECONNECT_CAP_S)
        refresh_s = self._ttl_s / 3
        while True:
            await self._active.wait()
            try:
                async with mqtt_session(
                    identifier=self._client_id,
                    max_inflight_messages=WINDOW,
                    **self._target.client_kwargs(self._ca),  # type: ignore[arg-type]
                ) as client:
                    client.pending_calls_threshold = WINDOW  # in flight on purpose: no warning
                    self.connected = True
                    backoff.reset()
                    log.info("connected to MQTT %s:%d", self._target.host, self._target.port)
                    self._pending = dict(self._latest)
                    while self._active.is_set():
                        while self._pending:
                            await self._send_all(client)
                        self._wake.clear()
                        # Idle, but not deaf: a broker lost meanwhile (restarted, maybe
                        # without its retained messages) is reconnected to, and sent
                        # every message again, at once rather than at the next change.
                        with contextlib.suppress(TimeoutError):
                            await unless_lost(
                                client, asyncio.wait_for(self._wake.wait(), refresh_s)
                            )
                        if not self._wake.is_set():  # time to re-seal before expiry
                            self._pending = dict(self._latest)
                            for gone in self._tails.keys() - self._latest.keys():
                                del self._tails[gone]  # a site removed
                self.connected = False
            except aiomqtt.MqttError as exc:
                self.connected = False
                delay = backoff.delay()
                log.warning("MQTT unavailable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
