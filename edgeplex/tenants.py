"""Tenants: who sends inference requests, with which keys, under which limits.

The control plane stores them and sends them to its sites in the signed desired
state; a standalone agent reads them from a tenants file. Either way an agent
holds a `TenantTable` and identifies a request's key locally, with no call to
anything on the request path.

A key is `epk_<id>_<secret>`: a public id (12 hex digits) to find the key's record
by, and 256 random bits. Only its SHA-256 is stored (a fast hash is enough for a
random key, and a slow one would cost every request); the key itself is shown
once, when issued. A tenant holds several keys at once, so keys rotate without
downtime: issue the new one, move clients over, revoke the old one.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgeplex.durable import write_atomic

KEY_PREFIX = "epk_"
_KEY = re.compile(r"epk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ANONYMOUS = "anonymous"  # the tenant a request without a key is counted under
DEFAULT = "default"  # the tenant an agent's single inference_api_key belongs to


class TenantKey(BaseModel):
    """One key's record: its public id and the SHA-256 of the whole key."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[0-9a-f]{12}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created: float = 0.0  # unix seconds


class Tenant(BaseModel):
    """A customer: limits enforced at each site, a fair-share weight, the models it
    may call (shell patterns; none listed: every model) and its keys."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME)
    rate: float | None = Field(default=None, gt=0, description="requests a second, per site")
    fleet_rate: float | None = Field(
        default=None, gt=0, description="requests a second across the fleet, split by demand"
    )
    burst: int | None = Field(default=None, ge=1, description="requests above the rate at once")
    concurrency: int | None = Field(default=None, ge=1, description="requests in flight at once")
    weight: float = Field(default=1.0, gt=0, le=1000, description="share under contention")
    models: list[str] = Field(default_factory=list, description="patterns of models it may call")
    keys: list[TenantKey] = Field(default_factory=list)

    @field_validator("models")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or len(pattern) > 200:
                raise ValueError(f"model pattern {pattern!r}: 1 to 200 characters")
        return value

    def allows(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, p) for p in self.models)

    def public(self) -> dict[str, Any]:
        """What `tenant show` prints: everything but the key hashes."""
        shown = self.model_dump(exclude={"keys"})
        shown["keys"] = [{"id": k.id, "created": k.created} for k in self.keys]
        return shown


def new_key() -> tuple[str, TenantKey]:
    """A new random key and its record (the key itself is not kept anywhere)."""
    key_id = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return key, TenantKey(id=key_id, sha256=key_hash(key), created=round(time.time(), 3))


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key: str) -> str | None:
    """The public id of a well-formed key, or None."""
    match = _KEY.fullmatch(key)
    return match.group(1) if match else None


class TenantTable:
    """Every tenant by name, and every key's record by its id, for lookups on the
    request path. `legacy` is a key of another form (an agent's single
    `inference_api_key` from before tenants) and the tenant it belongs to."""

    def __init__(
        self, tenants: list[Tenant] | None = None, legacy: tuple[str, Tenant] | None = None
    ) -> None:
        self.tenants: dict[str, Tenant] = {t.name: t for t in tenants or []}
        self._keys: dict[str, tuple[bytes, Tenant]] = {}
        for tenant in self.tenants.values():
            for key in tenant.keys:
                self._keys[key.id] = (bytes.fromhex(key.sha256), tenant)
        self._legacy: tuple[bytes, Tenant] | None = None
        self.legacy = legacy
        if legacy is not None:
            secret, owner = legacy
            self.tenants.setdefault(owner.name, owner)
            self._legacy = (hashlib.sha256(secret.encode()).digest(), self.tenants[owner.name])

    def __bool__(self) -> bool:
        return bool(self.tenants)

    def with_tenants(self, tenants: Iterable[Tenant]) -> TenantTable:
        """Another table of `tenants`, with this one's legacy key kept."""
        return TenantTable(list(tenants), legacy=self.legacy)

    def identify(self, token: str) -> Tenant | None:
        """The tenant whose key `token` is, or None (unknown, revoked, malformed).
        The hashes are compared in constant time."""
        found = self._keys.get(key_id(token) or "") or self._legacy
        if found is None:
            return None
        stored, tenant = found
        given = hashlib.sha256(token.encode()).digest()
        return tenant if hmac.compare_digest(given, stored) else None

    def dump(self) -> list[dict[str, Any]]:
        return [t.model_dump() for t in self.tenants.values()]

    @classmethod
    def parse(cls, records: list[Any]) -> TenantTable:
        tenants = [Tenant.model_validate(r) for r in records]
        names = [t.name for t in tenants]
        if len(set(names)) != len(names):
            raise ValueError("a tenant is listed twice")
        ids = [k.id for t in tenants for k in t.keys]
        if len(set(ids)) != len(ids):
            raise ValueError("a key id is listed twice")
        return cls(tenants)


def read_file(path: Path) -> TenantTable:
    """A tenants file (YAML or JSON): `tenants: [{name, rate, ..., keys: [...]}]`."""
    doc = yaml.safe_load(path.read_text()) or {}
    if not isinstance(doc, dict) or not isinstance(doc.get("tenants", []), list):
        raise ValueError(f"{path}: expected a mapping with a 'tenants' list")
    return TenantTable.parse(doc.get("tenants", []))


def write_file(path: Path, table: TenantTable) -> None:
    """The table back into its file, whole or not at all, readable by its owner only
    (it holds key hashes)."""
    text = yaml.safe_dump({"tenants": table.dump()}, sort_keys=False)
    write_atomic(path, text.encode(), mode=0o600)


# --- what `edgeplex admin tenant` does, on a table kept in Redis or in a file ----------


class UnknownTenant(KeyError):
    def __str__(self) -> str:
        return f"no tenant '{self.args[0]}'"


class TenantExists(ValueError):
    pass


LIMITS = ("rate", "fleet_rate", "burst", "concurrency", "weight", "models")


def add(table: TenantTable, name: str, limits: dict[str, Any]) -> TenantTable:
    """The table with a new tenant; ValueError if the name is taken or a limit is not
    valid."""
    if name in table.tenants:
        raise TenantExists(f"tenant '{name}' exists already (update it instead)")
    tenant = _valid({"name": name, **_given(limits)})
    return table.with_tenants([*table.tenants.values(), tenant])


def update(table: TenantTable, name: str, limits: dict[str, Any]) -> TenantTable:
    """The table with the given limits of tenant `name` changed (the others kept)."""
    tenant = get(table, name)
    merged = {**tenant.model_dump(), **_given(limits)}
    changed = _valid(merged)
    return table.with_tenants([changed if t.name == name else t for t in table.tenants.values()])


def remove(table: TenantTable, name: str) -> TenantTable:
    get(table, name)
    return table.with_tenants([t for t in table.tenants.values() if t.name != name])


def issue_key(table: TenantTable, name: str) -> tuple[TenantTable, str, TenantKey]:
    """The table with a new key for tenant `name`, the key (shown once) and its record."""
    tenant = get(table, name)
    key, record = new_key()
    changed = tenant.model_copy(update={"keys": [*tenant.keys, record]})
    return (
        table.with_tenants([changed if t.name == name else t for t in table.tenants.values()]),
        key,
        record,
    )


def revoke_key(table: TenantTable, name: str, key: str) -> TenantTable:
    """The table without tenant `name`'s key `key` (its id, or the whole key)."""
    tenant = get(table, name)
    wanted = key_id(key) or key
    kept = [k for k in tenant.keys if k.id != wanted]
    if len(kept) == len(tenant.keys):
        raise ValueError(f"tenant '{name}' has no key '{wanted[:16]}'")
    changed = tenant.model_copy(update={"keys": kept})
    return table.with_tenants([changed if t.name == name else t for t in table.tenants.values()])


def _valid(record: dict[str, Any]) -> Tenant:
    """A tenant from its fields; ValueError naming each field that is wrong."""
    try:
        return Tenant.model_validate(record)
    except ValidationError as exc:
        wrong = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'tenant'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(wrong) from None


def get(table: TenantTable, name: str) -> Tenant:
    tenant = table.tenants.get(name)
    if tenant is None:
        raise UnknownTenant(name)
    return tenant


def _given(limits: dict[str, Any]) -> dict[str, Any]:
    """The limits given (None: not given); 0 for a rate, burst or concurrency lifts it."""
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ValueError(f"not a tenant limit: {', '.join(sorted(unknown))}")
    given = {k: v for k, v in limits.items() if v is not None}
    for name in ("rate", "fleet_rate", "burst", "concurrency"):
        if given.get(name) == 0:
            given[name] = None
    return given


# --- a fleet-wide rate, split across sites ---------------------------------------------

MIN_SHARE = 0.05  # what a site with none of the tenant's recent demand still gets


def split_rate(fleet_rate: float, demand: dict[str, float], sites: list[str]) -> dict[str, float]:
    """Each site's rate of a tenant limited to `fleet_rate` across the fleet: its share
    of the tenant's recent requests (`demand`, by site), with every site given at
    least MIN_SHARE of it so new traffic there is served while the shares catch up.
    The shares are renormalised, so the sites' rates add up to `fleet_rate` (each
    rounded to two significant digits)."""
    if not sites:
        return {}
    total = sum(max(0.0, demand.get(s, 0.0)) for s in sites)
    raw = {s: (demand.get(s, 0.0) / total if total > 0 else 1.0 / len(sites)) for s in sites}
    floored = {s: max(MIN_SHARE, share) for s, share in raw.items()}
    scale = sum(floored.values())
    # Two significant digits: demand that barely moves sends no new desired state.
    return {s: float(f"{fleet_rate * share / scale:.2g}") for s, share in floored.items()}


def for_site(table: TenantTable, rates: dict[str, dict[str, float]], site: str) -> TenantTable:
    """The table as `site` enforces it: a tenant with a fleet-wide rate gets its
    site's part of it (`rates[tenant][site]`) as its rate there, unless its own
    per-site rate is lower."""
    tenants = []
    for tenant in table.tenants.values():
        part = rates.get(tenant.name, {}).get(site)
        if tenant.fleet_rate is not None and part is not None:
            rate = part if tenant.rate is None else min(part, tenant.rate)
            tenant = tenant.model_copy(update={"rate": rate})
        tenants.append(tenant)
    return table.with_tenants(tenants)
