"""Models this site was asked for and no site holds: loaded here on demand.

A request for a model that is not in this site's repository, when no peer
holds it either, asks the control plane for the model's catalog entry
(`AgentService.LookupModel`). The reply is a SignedMessage of kind
"catalog-entry" addressed to this site and carrying the nonce the agent sent,
so neither a forged nor a replayed reply is used. The artifact is fetched into
the content-addressed cache (sha256 checked before use) and installed in the
repository as the reconciler installs desired models; the request then waits
for the load within its own deadline, validated against the model's
interface before the load starts (core.py). The lookup is also how the
control plane learns of the demand: it places the model from it at once,
preferring this site, where it is being loaded.

One lookup runs per model at a time and concurrent first calls share it; it
carries on when the request that started it times out. A name the catalog
does not have is remembered for NOT_FOUND_TTL_S and at most MAX_LOOKUPS run at
once, so names a client makes up cost the control plane little.

Owned by the agent's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError

from edgeplex.agent.catalog.repository import scan_model
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import ModelFailed, ModelNotFound, Unavailable
from edgeplex.artifacts import ArtifactError
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.signing import CATALOG_ENTRY, Rejected, TrustStore, site_audience

if TYPE_CHECKING:  # the core imports the fleet package
    from edgeplex.agent.core import Agent
    from edgeplex.agent.fleet.reconcile import Reconciler

log = logging.getLogger("edgeplex.agent.on_demand")

NOT_FOUND_TTL_S = 5.0
MAX_LOOKUPS = 8
MAX_REMEMBERED = 4096
LOOKUP_TIMEOUT_S = 5.0


class OnDemand:
    def __init__(
        self,
        site_id: str,
        agent: Agent,
        reconciler: Reconciler,
        trust: TrustStore,
        channel: Callable[[], grpc.aio.Channel],
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        self._site = site_id
        self._agent = agent
        self._reconciler = reconciler
        self._trust = trust
        self._new_channel = channel
        self._channel: grpc.aio.Channel | None = None
        self._metadata = metadata
        self._running: dict[str, asyncio.Task[None]] = {}
        self._not_found: dict[str, float] = {}  # name -> monotonic time it expires
        self._reasons: dict[str, str] = {}  # name -> why it may not be loaded here

    async def fetch(self, name: str, version: str, origin: str, timeout_s: float) -> None:
        """Make `name` a model of this site's repository, within `timeout_s`. Raises
        ModelNotFound (not in the catalog), Unavailable (the control plane cannot be
        asked, or too many lookups run) or ModelFailed (its artifact is unusable)."""
        if self._not_found.get(name, 0.0) > time.monotonic():
            if self._reasons.get(name):
                raise Unavailable(f"model '{name}' {self._reasons[name]}")
            raise ModelNotFound.unknown(name, detail="not in the fleet's catalog")
        task = self._running.get(name)
        if task is None:
            if len(self._running) >= MAX_LOOKUPS:
                raise Unavailable(f"model '{name}' is not at this site; too many lookups run")
            task = asyncio.create_task(self._install(name, origin))
            self._running[name] = task
            task.add_done_callback(lambda _: self._running.pop(name, None))
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            raise Unavailable(f"model '{name}': still fetching its artifact") from None
        record = self._agent.residency.get(name)
        if version and (record is None or record.version != version):
            raise ModelNotFound.unknown(name, version, "not in the fleet's catalog")

    async def _install(self, name: str, origin: str) -> None:
        entry = await self._lookup(name, origin)
        if not entry.found:
            METRICS.on_demand.labels(result="not_in_catalog").inc()
            self._remember_refusal(name, entry.reason)
            if entry.reason:
                raise Unavailable(f"model '{name}' {entry.reason}")
            raise ModelNotFound.unknown(name, detail="not in the fleet's catalog")
        model = entry.model
        if model.name != name:
            raise Unavailable(f"model '{name}': the control plane answered for '{model.name}'")
        started = time.monotonic()
        try:
            await asyncio.to_thread(self._reconciler.install, model)
        except Exception as exc:  # whatever the cause, the model failed, with a reason
            known = isinstance(exc, ArtifactError | ValueError)
            reason = str(exc) if known else type(exc).__name__
            self._reconciler.failures[name] = reason
            METRICS.on_demand.labels(result="failed").inc()
            raise ModelFailed(f"model '{name}': its artifact is unusable: {reason}") from None
        self._reconciler.failures.pop(name, None)
        settings = self._agent.settings
        source = await asyncio.to_thread(
            scan_model, settings.model_repo, name, settings.model_defaults
        )
        if source is None:
            raise ModelFailed(f"model '{name}': installed, yet not in the repository")
        self._agent.residency.add(source)
        METRICS.on_demand.labels(result="installed").inc()
        log.info(
            "model %s: fetched on demand in %.2f s (asked from %s)",
            name,
            time.monotonic() - started,
            origin,
        )

    def _remember_refusal(self, name: str, reason: str) -> None:
        now = time.monotonic()
        if len(self._not_found) >= MAX_REMEMBERED:  # made-up names: forget the expired
            for old in [n for n, until in self._not_found.items() if until <= now]:
                del self._not_found[old]
                self._reasons.pop(old, None)
        if len(self._not_found) < MAX_REMEMBERED:
            self._not_found[name] = now + NOT_FOUND_TTL_S
            self._reasons[name] = reason

    async def _lookup(self, name: str, origin: str) -> pb.CatalogEntry:
        nonce = secrets.token_bytes(16)
        request = pb.ModelLookup(site_id=self._site, model=name, origin_region=origin, nonce=nonce)
        signed = None
        for attempt in range(2):  # a cached channel may sit in reconnect backoff: renew it once
            if self._channel is None:
                self._channel = self._new_channel()
            stub = pb_grpc.AgentServiceStub(self._channel)
            try:
                signed = await stub.LookupModel(
                    request, timeout=LOOKUP_TIMEOUT_S, metadata=self._metadata
                )
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE and attempt == 0:
                    await self._channel.close()
                    self._channel = None
                    continue
                raise Unavailable(
                    f"model '{name}' is not at this site and the control plane cannot be "
                    f"asked now ({exc.code().name})"
                ) from None
        assert signed is not None
        try:
            opened = self._trust.open(
                signed.SerializeToString(), CATALOG_ENTRY, site_audience(self._site), ordered=False
            )
            entry = pb.CatalogEntry.FromString(opened.payload)
        except (Rejected, DecodeError) as exc:
            METRICS.rejected_messages.labels(reason=getattr(exc, "reason", "malformed")).inc()
            raise Unavailable(f"model '{name}': the catalog entry was refused ({exc})") from None
        if entry.nonce != nonce:
            METRICS.rejected_messages.labels(reason="stale").inc()
            raise Unavailable(f"model '{name}': the catalog entry answers another lookup")
        return entry

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
