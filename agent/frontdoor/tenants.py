"""Tenants at this agent: whose key a request carries, whether that tenant may call
the model, and whether its rate and concurrency limits leave room, decided before
the request is decoded or queued.

Keys are looked up in the local table (edgeplex/tenants.py): no call leaves the
agent. Each tenant has a token bucket (`rate` a second, `burst` at once) and a
count of its requests in flight (`concurrency`); a request over either is refused
with 429 and Retry-After (RESOURCE_EXHAUSTED over gRPC) and costs nothing more. A
request forwarded by a fleet peer names its tenant in a header, believed only
with the fleet's peer token; the serving agent applies that tenant's limits.
Without any tenant, requests are anonymous unless `security.anonymous: deny`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeplex.agent.fleet.forward import TENANT_HEADER
from edgeplex.agent.frontdoor.settings import SecuritySettings
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import PermissionDenied, RateLimited, Unauthenticated
from edgeplex.net import bearer_token
from edgeplex.tenants import ANONYMOUS, DEFAULT, Tenant, TenantTable, read_file

log = logging.getLogger("edgeplex.agent.tenants")

ADMIN = "admin"  # the agent's admin token: no tenant's limits
PEER = "fleet-peer"  # the fleet's peer token: a forward, whose tenant TENANT_HEADER names
_KNOWN = 4096  # Authorization values remembered as valid (beyond: forgotten, all at once)


@dataclass
class Bucket:
    """A token bucket: `rate` tokens a second up to `burst`."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """0.0 when a token was taken; else the seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class Tenants:
    """The tenant table in force, and each tenant's bucket and requests in flight."""

    def __init__(
        self,
        table: TenantTable | None = None,
        anonymous: str = "auto",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.anonymous = anonymous  # auto | allow | deny
        self._admin: bytes | None = None
        self._peer_token: bytes | None = None
        # Authorization values found valid, and whose: a keep-alive client sends the
        # same one on every request, and its hash and constant-time compare are then
        # done once. Emptied whenever the table or a token changes.
        self._known: dict[str, str] = {}
        self._clock = clock
        self._counters: dict[tuple[str, str], Any] = {}
        self.table = TenantTable()
        self._buckets: dict[str, Bucket] = {}
        self.inflight: dict[str, int] = {}
        self.replace(table or TenantTable())

    @property
    def admin(self) -> bytes | None:
        """The agent's admin token (auth.Credentials sets it)."""
        return self._admin

    @admin.setter
    def admin(self, token: bytes | None) -> None:
        self._admin = token
        self._known = {}

    @property
    def peer_token(self) -> bytes | None:
        """The fleet's peer token (from the signed desired state)."""
        return self._peer_token

    @peer_token.setter
    def peer_token(self, token: bytes | None) -> None:
        self._peer_token = token
        self._known = {}

    @property
    def anonymous_allowed(self) -> bool:
        """Requests without a key are served: `allow`, or `auto` with no tenant."""
        return self.anonymous == "allow" or (self.anonymous == "auto" and not self.table)

    def replace(self, table: TenantTable) -> None:
        """A new table (a file reread, a new desired state). A tenant whose limits
        did not change keeps its bucket, one whose rate changed keeps the tokens it
        had left; requests in flight stay counted."""
        buckets = {}
        for name, tenant in table.tenants.items():
            old = self._buckets.get(name)
            if tenant.rate is None:
                continue
            burst = float(tenant.burst or max(1, round(tenant.rate)))
            if old is None:
                buckets[name] = Bucket(tenant.rate, burst, burst, self._clock())
            elif (old.rate, old.burst) == (tenant.rate, burst):
                buckets[name] = old
            else:  # a new rate (a fleet-wide one rebalanced): the tokens left carry over
                buckets[name] = Bucket(tenant.rate, burst, min(old.tokens, burst), old.stamp)
        self.table, self._buckets = table, buckets
        self._known = {}

    def replace_from(self, records_json: str, source: str) -> bool:
        """A new table from JSON records (the signed desired state's), the agent's own
        legacy key kept; a table that does not parse is logged and the old one kept."""
        try:
            parsed = TenantTable.parse(json.loads(records_json))
        except ValueError as exc:
            log.error("tenants from %s ignored: %s", source, exc)
            return False
        self.replace(self.table.with_tenants(parsed.tenants.values()))
        return True

    async def follow(self, path: Path, every_s: float = 1.0) -> None:
        """Reread the tenants file whenever it changes (a new key works, a revoked one
        stops working, within `every_s`); a file that does not parse is logged and
        the table in force kept."""
        seen = _stamp(path)
        while True:
            await asyncio.sleep(every_s)
            stamp = _stamp(path)
            if stamp == seen:
                continue
            seen = stamp
            try:
                table = read_file(path)
            except (OSError, ValueError) as exc:
                log.error("tenants file %s ignored: %s", path, exc)
                continue
            self.replace(self.table.with_tenants(table.tenants.values()))
            log.info("tenants file %s reread: %d tenants", path, len(table.tenants))

    def identify(self, authorization: str | None) -> str:
        """Who a request's `Authorization` says it comes from: a tenant's name, ADMIN,
        PEER, or ANONYMOUS where that is allowed; else Unauthenticated."""
        if authorization:
            known = self._known.get(authorization)
            if known is not None:
                return known
        token = bearer_token(authorization)
        if token is None:
            if self.anonymous_allowed:
                return ANONYMOUS
            raise Unauthenticated("inference needs 'Authorization: Bearer <key>'")
        tenant = self.table.identify(token)
        if tenant is not None:
            who = tenant.name
        elif self.admin is not None and _same(token, self.admin):
            who = ADMIN
        elif self.peer_token and _same(token, self.peer_token):
            who = PEER
        elif not self.table and self.anonymous_allowed:
            who = ANONYMOUS  # no tenants: a token is not asked for, so not checked
        else:
            raise Unauthenticated("inference: the key is not valid")
        if len(self._known) >= _KNOWN:  # many spellings of valid keys: start again
            self._known = {}
        self._known[authorization] = who  # type: ignore[index]
        return who

    def caller(self, header: Callable[[str], str | None]) -> str:
        """The tenant a request is served for: the key's, or for a forward from a
        fleet peer the one it names."""
        who = self.identify(header("authorization"))
        if who == PEER:
            named = header(TENANT_HEADER) or ANONYMOUS
            return named if len(named) <= 63 else ANONYMOUS
        return who

    def resolve(self, checked: str, header: Callable[[str], str | None]) -> str:
        """The tenant a request is served for, from what the door's credentials check
        found (`checked`: a tenant, ADMIN, PEER, or "" where the door did not check)."""
        return checked if checked and checked != PEER else self.caller(header)

    def admit(self, name: str, model: str) -> Tenant | None:
        """Tenant `name` may send a request to `model` now: PermissionDenied if the
        model is not among its models, RateLimited if its rate or concurrency is
        spent; counted in flight until release(name)."""
        tenant = self.table.tenants.get(name)
        counted = self._counted
        if tenant is None:  # ADMIN, ANONYMOUS, or a tenant removed since
            if name not in (ADMIN, ANONYMOUS):
                raise Unauthenticated(f"tenant '{name}' is not known here")
            self.inflight[name] = self.inflight.get(name, 0) + 1
            counted(name, "admitted").inc()
            return None
        if not tenant.allows(model):
            counted(name, "forbidden").inc()
            raise PermissionDenied(f"tenant '{name}' may not call model '{model}'")
        held = self.inflight.get(name, 0)
        if tenant.concurrency is not None and held >= tenant.concurrency:
            counted(name, "concurrency_limited").inc()
            raise RateLimited(
                f"tenant '{name}' has {held} requests in flight, its limit", retry_after_s=1.0
            )
        bucket = self._buckets.get(name)
        if bucket is not None:
            wait = bucket.take(self._clock())
            if wait:
                counted(name, "rate_limited").inc()
                raise RateLimited(
                    f"tenant '{name}' is over its rate of {bucket.rate:g} requests a second",
                    retry_after_s=wait,
                )
        self.inflight[name] = held + 1
        counted(name, "admitted").inc()
        return tenant

    def _counted(self, name: str, outcome: str) -> Any:
        """The counter of `name`'s requests with `outcome` (its label lookup once; the
        names are this table's tenants, ADMIN and ANONYMOUS only)."""
        child = self._counters.get((name, outcome))
        if child is None:
            child = METRICS.tenant_requests.labels(tenant=name, outcome=outcome)
            self._counters[(name, outcome)] = child
        return child

    def refund(self, name: str) -> None:
        """Give back the rate token admit(name) took, for a request that turned out
        not to be the tenant's to count: a forwarder's search for the holder of a
        sequence, at a holder without it."""
        bucket = self._buckets.get(name)
        if bucket is not None:
            bucket.tokens = min(bucket.burst, bucket.tokens + 1.0)

    def release(self, name: str) -> None:
        left = self.inflight.get(name, 1) - 1
        if left > 0:
            self.inflight[name] = left
        else:
            self.inflight.pop(name, None)


def _stamp(path: Path) -> tuple[float, int, int]:
    try:
        info = path.stat()
    except OSError:
        return (0.0, 0, 0)
    return (info.st_mtime, info.st_size, info.st_ino)


def _same(token: str, secret: bytes) -> bool:
    return hmac.compare_digest(token.encode(), secret)


def tenants_of(security: SecuritySettings) -> TenantTable:
    """The agent's own tenants: its tenants file's, and its inference_api_key as the
    key of tenant `default`."""
    table = read_file(security.tenants_file) if security.tenants_file else TenantTable()
    key = security.inference_api_key
    if key is None or not key.get_secret_value():
        return table
    default = table.tenants.get(DEFAULT) or Tenant(name=DEFAULT)
    return TenantTable(list(table.tenants.values()), legacy=(key.get_secret_value(), default))
