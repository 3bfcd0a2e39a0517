"""Background upkeep of the model table: pre-staging, prepacked rebuilds,
elastic instances and idle expiry.

These are methods of ModelTable (it inherits this class), split out of
models.py for size; the same ownership rules hold: they run on the agent's
event loop, never await between reading and writing an entry, and report
slow work back through tasks tagged with the entry's generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeplex.agent import ipc
from edgeplex.agent.batcher import scale_target
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.entry import SHARED_RUNNER, ModelEntry, ModelState, Tier
from edgeplex.agent.errors import RunnerLost
from edgeplex.agent.eviction import Candidate, EvictionPolicy, IdleTimeToLive
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.runners import RunnerPool

log = logging.getLogger("edgeplex.agent.models")


class TableUpkeep:
    _entries: dict[str, ModelEntry]
    _settings: AgentSettings
    _pool: RunnerPool
    _last_upgrade: float
    policy: EvictionPolicy

    if TYPE_CHECKING:  # provided by ModelTable

        def _spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
        def device_bytes(self) -> int: ...
        def host_bytes(self) -> int: ...
        def staged_dir(self, entry: ModelEntry) -> Path: ...
        def _publish_tiers(self) -> None: ...
        def _candidates(self, exclude: ModelEntry | None) -> list[Candidate]: ...
        def demote(self, name: str, tier: Tier, reason: str = ...) -> asyncio.Future[None]: ...

    async def stage(self, name: str) -> bool:
        """cached -> staged in the background (no session, shared runner only), if the
        host budget allows. True when the model is staged afterwards."""
        entry = self._entries.get(name)
        if (
            entry is None
            or entry.staged_bytes
            or entry.source.config is None
            or entry.runner_id != SHARED_RUNNER
            or entry.state != ModelState.UNAVAILABLE
        ):
            return bool(entry and entry.staged_bytes)
        budget = self._settings.host_memory_budget
        if budget is not None and self.host_bytes() + entry.estimate_bytes() > budget:
            return False
        runner = self._pool.get(SHARED_RUNNER)
        await runner.ensure_ready()
        try:
            reply, _ = await runner.call(
                ipc.StageModel(
                    self._pool.next_req_id(),
                    entry.name,
                    str(entry.source.path),
                    str(self.staged_dir(entry)),
                )
            )
        except RunnerLost:
            return False
        if not isinstance(reply, ipc.ModelStaged):
            log.warning("staging %s failed: %s", name, getattr(reply, "message", reply))
            return False
        if entry.state != ModelState.READY:  # a load may have raced us; it reports too
            entry.staged_bytes = reply.staged_bytes
        self._publish_tiers()
        return True

    def upgrade_sessions(self) -> None:
        """Rebuild with prepacked weights the models that stayed loaded after a fast
        promotion (called on a timer), one at a time, while the budget has room for
        the transient copy."""
        settings = self._settings
        now = time.monotonic()
        if (
            not settings.runner.prepack_weights
            or now - self._last_upgrade < 1.0
            or any(e.upgrading for e in self._entries.values())
        ):
            return  # at most one rebuild a second: each one copies a model's weights
        budget = settings.device_memory_budget
        for entry in self._entries.values():
            if (
                entry.state != ModelState.READY
                or entry.prepacked
                or now - entry.loaded_at < settings.runner.prepack_after_s
            ):
                continue
            if budget is not None and self.device_bytes() + entry.staged_bytes > budget:
                continue
            entry.upgrading = True
            self._last_upgrade = now
            self._spawn(self._prepack_task(entry, entry.generation))
            return

    async def _prepack_task(self, entry: ModelEntry, generation: int) -> None:
        try:
            reply, _ = await self._pool.get(entry.runner_id).call(
                ipc.Prepack(self._pool.next_req_id(), entry.name)
            )
        except RunnerLost:
            return
        finally:
            entry.upgrading = False
        if generation != entry.generation or entry.state != ModelState.READY:
            return
        if isinstance(reply, ipc.Prepacked):
            entry.prepacked = True
            entry.memory_bytes = max(1, entry.memory_bytes + reply.bytes_delta)
            entry.last_measured = entry.memory_bytes
            METRICS.model_memory.labels(model=entry.name).set(entry.memory_bytes)
            METRICS.promotion_stage_duration.labels(stage="prepack").observe(reply.ms / 1000)
            self._publish_tiers()
        else:
            entry.prepacked = True  # do not retry a model that cannot be prepacked
            log.warning("prepacking %s failed: %s", entry.name, getattr(reply, "message", ""))

    def autoscale(self) -> None:
        """Elastic instances (called on a timer): grow a model's instances while its queue
        outruns them, shrink after it idles. Instances share one session, so growth
        costs activations only; none is added while the device budget is nearly full."""
        budget = self._settings.device_memory_budget
        room = budget is None or self.device_bytes() < 0.95 * budget
        now = time.monotonic()
        for entry in self._entries.values():
            config = entry.source.config
            batcher = entry.batcher
            if (
                config is None
                or config.max_instances is None
                or batcher is None
                or entry.state != ModelState.READY
                or entry.scaling
            ):
                continue
            target = scale_target(
                depth=batcher.depth,
                instances=batcher.instances,
                minimum=config.instance_count,
                maximum=max(config.max_instances, config.instance_count),
                max_batch_size=entry.max_batch_size,
                idle_s=now - batcher.last_queued,
                scale_down_idle_s=config.scale_down_idle_s,
            )
            if target > batcher.instances and not room:
                continue
            if target != batcher.instances:
                entry.scaling = True
                self._spawn(self._scale_task(entry, entry.generation, target))

    async def _scale_task(self, entry: ModelEntry, generation: int, target: int) -> None:
        try:
            reply, _ = await self._pool.get(entry.runner_id).call(
                ipc.SetInstances(self._pool.next_req_id(), entry.name, target)
            )
        except RunnerLost:
            return
        finally:
            entry.scaling = False
        if (
            generation == entry.generation
            and entry.batcher is not None
            and isinstance(reply, ipc.InstancesSet)
            and reply.instances
        ):
            log.info(
                "model %s: %d -> %d instances", entry.name, entry.batcher.instances, reply.instances
            )
            METRICS.instances.labels(model=entry.name).set(reply.instances)
            entry.batcher.set_instances(reply.instances)

    def expire_idle(self) -> None:
        """Under the ttl policy: demote models idle past the TTL (called on a timer)."""
        if not isinstance(self.policy, IdleTimeToLive):
            return
        for victim in self.policy.expired(self._candidates(exclude=None), time.monotonic()):
            self.demote(victim.name, Tier.STAGED, reason="idle")
