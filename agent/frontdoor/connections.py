"""Who may hold a connection to a door: caps in total and per client address,
the longest-idle connection closed first to make room, and a penalty box for
addresses caught abusing the protocol.

One `ConnectionLimiter` per door, used from the event loop only. A connection
registers when it is made (`admit`, which may refuse it), says when it turns
idle or busy, and leaves (`leave`) when it is lost.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

from edgeplex.agent.observability.metrics import METRICS


class Closable(Protocol):
    def close_idle(self) -> None:
        """Close now: the limiter needs the room (the connection is idle)."""


class ConnectionLimiter:
    def __init__(self, door: str, max_total: int, max_per_client: int, penalty_s: float) -> None:
        self.door = door
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.penalty_s = penalty_s
        self._all: set[Closable] = set()
        self._by_client: dict[str, set[Closable]] = {}
        self._idle: OrderedDict[Closable, str] = OrderedDict()  # longest idle first
        self._penalised: dict[str, float] = {}  # address -> until (monotonic)

    def __len__(self) -> int:
        return len(self._all)

    def admit(self, conn: Closable, client: str) -> bool:
        """Register `conn` from `client`; False: refused (the caller closes it)."""
        until = self._penalised.get(client)
        if until is not None:
            if time.monotonic() < until:
                METRICS.door_refusals.labels(door=self.door, reason="penalised").inc()
                return False
            del self._penalised[client]
        mine = self._by_client.get(client, set())
        if len(mine) >= self.max_per_client and not self._evict(mine):
            METRICS.door_refusals.labels(door=self.door, reason="per_client_cap").inc()
            return False
        if len(self._all) >= self.max_total and not self._evict(self._all):
            METRICS.door_refusals.labels(door=self.door, reason="connection_cap").inc()
            return False
        self._all.add(conn)
        self._by_client.setdefault(client, set()).add(conn)
        self._idle[conn] = client
        METRICS.door_connections.labels(door=self.door).set(len(self._all))
        return True

    def _evict(self, among: set[Closable]) -> bool:
        """Close the longest-idle connection of `among`; False when none is idle."""
        for conn, client in self._idle.items():
            if conn in among:
                self._forget(conn, client)
                METRICS.door_refusals.labels(door=self.door, reason="idle_evicted").inc()
                conn.close_idle()
                return True
        return False

    def idle(self, conn: Closable, client: str) -> None:
        if conn in self._all:
            self._idle[conn] = client
            self._idle.move_to_end(conn)

    def busy(self, conn: Closable) -> None:
        self._idle.pop(conn, None)

    def leave(self, conn: Closable, client: str) -> None:
        if conn in self._all:
            self._forget(conn, client)

    def _forget(self, conn: Closable, client: str) -> None:
        self._all.discard(conn)
        self._idle.pop(conn, None)
        mine = self._by_client.get(client)
        if mine is not None:
            mine.discard(conn)
            if not mine:
                del self._by_client[client]
        METRICS.door_connections.labels(door=self.door).set(len(self._all))

    def penalise(self, client: str, reason: str) -> None:
        """`client` broke the rules: refuse its new connections for a while."""
        METRICS.door_refusals.labels(door=self.door, reason=reason).inc()
        if self.penalty_s > 0:
            self._penalised[client] = time.monotonic() + self.penalty_s
            if len(self._penalised) > 4 * self.max_total:  # bounded: drop the expired
                now = time.monotonic()
                self._penalised = {a: t for a, t in self._penalised.items() if t > now}
