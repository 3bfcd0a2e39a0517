"""Signed control messages from the broker, verified before anything uses them.

The fleet link hands every MQTT message here. Each is opened with the agent's
`TrustStore` (edgeplex/signing.py): a message that fails any check is dropped,
logged and counted in `edgeplex_agent_rejected_messages_total{reason}`, and
changes nothing. Messages that arrive before any key is trusted (a first start
without a configured key, before the registration pins one) are held, the
newest per topic, and opened once the key is pinned.

Owned by the agent's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgeplex.agent.observability.metrics import METRICS
from edgeplex.fleet import desired_topic, key_topic, routes_topic
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.signing import (
    DESIRED,
    ROLLOVER,
    ROUTES,
    Rejected,
    TrustStore,
    region_audience,
    site_audience,
)

log = logging.getLogger("edgeplex.agent.fleet")

FLEET_AUDIENCE = "fleet"


class ControlMessages:
    def __init__(
        self,
        site_id: str,
        region: str,
        trust: TrustStore,
        on_desired: Callable[[pb.DesiredState], None],
        on_routes: Callable[[pb.Routes], None],
    ) -> None:
        self.trust = trust
        self._on_desired = on_desired
        self._on_routes = on_routes
        self._kinds = {
            desired_topic(site_id): (DESIRED, site_audience(site_id)),
            routes_topic(region): (ROUTES, region_audience(region)),
            key_topic(): (ROLLOVER, FLEET_AUDIENCE),
        }
        self._held: dict[str, bytes] = {}

    @property
    def topics(self) -> list[str]:
        return list(self._kinds)

    def pin(self, key_id: str, public: bytes) -> None:
        """The key the control plane presented at registration."""
        if not public:
            return
        if not self.trust.pin(public):
            log.error(
                "the control plane presents signing key %s, but this site trusts %s; its "
                "messages are refused until a rollover signed by the trusted key arrives",
                key_id,
                ", ".join(self.trust.keys),
            )
            return
        held, self._held = self._held, {}
        for topic, payload in held.items():
            self.receive(topic, payload)

    def receive(self, topic: str, payload: bytes) -> None:
        kind_audience = self._kinds.get(topic)
        if kind_audience is None:
            return
        kind, audience = kind_audience
        try:
            opened = self.trust.open(payload, kind, audience)
        except Rejected as exc:
            if exc.reason == "unknown_key" and not self.trust.keys:
                self._held[topic] = payload  # opened once registration pins the key
                return
            METRICS.rejected_messages.labels(reason=exc.reason).inc()
            log.warning("rejected a %s message on %s: %s", kind, topic, exc)
            return
        try:
            if kind == DESIRED:
                self._on_desired(pb.DesiredState.FromString(opened.payload))
            elif kind == ROUTES:
                self._on_routes(pb.Routes.FromString(opened.payload))
            else:
                log.warning("signing key rolled over to %s", self.trust.rollover(opened))
        except Exception as exc:  # signed, yet not what it claims to be
            METRICS.rejected_messages.labels(reason="malformed").inc()
            log.warning("rejected a signed %s message: %s", kind, str(exc)[:200])
