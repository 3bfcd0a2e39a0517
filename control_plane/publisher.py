"""Desired state and routes out to the agents: retained QoS 1 MQTT messages.

`publish()` only records the latest payload per topic and wakes the task in
`run()`, which owns the MQTT connection. After every (re)connect the task
sends the latest payload of every topic again, so a broker that lost its
retained messages (restarted without persistence) gets them back.
"""

from __future__ import annotations

import asyncio
import logging

import aiomqtt

from edgeplex.fleet import Backoff, parse_mqtt_url

log = logging.getLogger("edgeplex.control_plane.publisher")


class Publisher:
    def __init__(self, url: str, client_id: str) -> None:
        self._target = parse_mqtt_url(url)
        self._client_id = client_id
        self._latest: dict[str, bytes] = {}
        self._pending: dict[str, bytes] = {}
        self._wake = asyncio.Event()
        self.connected = False
        self.published = 0

    def publish(self, topic: str, payload: bytes) -> None:
        """Queue the newest payload of `topic`; older unsent payloads are dropped."""
        if self._latest.get(topic) == payload:
            return
        self._latest[topic] = payload
        self._pending[topic] = payload
        self._wake.set()

    def forget(self) -> None:
        """Stop republishing (this replica is no longer the leader)."""
        self._latest.clear()
        self._pending.clear()

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                async with aiomqtt.Client(
                    identifier=self._client_id,
                    **self._target.client_kwargs(),  # type: ignore[arg-type]
                ) as client:
                    self.connected = True
                    backoff.reset()
                    log.info("connected to MQTT %s:%d", self._target.host, self._target.port)
                    self._pending = dict(self._latest)
                    while True:
                        while self._pending:
                            topic, payload = self._pending.popitem()
                            try:
                                await client.publish(topic, payload, qos=1, retain=True)
                            except BaseException:
                                self._pending.setdefault(topic, payload)
                                raise
                            self.published += 1
                        self._wake.clear()
                        await self._wake.wait()
            except aiomqtt.MqttError as exc:
                self.connected = False
                delay = backoff.delay()
                log.warning("MQTT unavailable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
