"""The model table: every model of the repository, its state, tier and runner.

State machine of one model:

    UNAVAILABLE --load--> LOADING --ok--> READY --demote/unload--> UNLOADING --> UNAVAILABLE
                             |  ^           |
                          error |      runner lost
                             v  +-----------+   (reloaded when the runner is back)
                           FAILED --load--> LOADING

Tiers (docs/architecture.md, "Memory over-commit"): a READY model is `loaded`
(a live session); otherwise it is `staged` when its pre-optimized copy is in
host RAM, else `cached` (its verified file on local disk). A request for a
model that is not loaded promotes it (`ensure_loaded`); a load that needs
device memory first demotes victims chosen by the eviction policy, and waits
until they have released it, so the loaded bytes never exceed the budget.

Ownership: the table is mutated only by its own methods, and only on the
agent's event loop. No method awaits between reading and writing state, so
each one is atomic; slow work (a load, a drain) runs in a task that reports
back through `_load_done` / `_unload_done`, tagged with the entry's generation
so a stale result is ignored. Front doors read entries but never write them.

Guarantees: at most one load per model is in flight; a model whose load fails
is FAILED with the reason (no path in it) and touches no other model; a model
whose load crashes its runner twice is FAILED rather than crash-looping the
runner it shares with others; pinned models are never evicted; a model with
requests in flight is drained before it is demoted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from pathlib import Path

from edgeplex.agent import ipc
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.dispatch import make_batcher
from edgeplex.agent.entry import (
    SHARED_RUNNER,
    ModelEntry,
    ModelState,
    Tier,
    apply_metadata,
    record_promotion,
)
from edgeplex.agent.errors import (
    InvalidInput,
    ModelFailed,
    ModelNotFound,
    NoRoom,
    RunnerLost,
    ServeError,
    Unavailable,
)
from edgeplex.agent.eviction import GreedyDualSizeFrequency, make_policy
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.repository import scan_model, scan_repository
from edgeplex.agent.room import TableRoom
from edgeplex.agent.runners import RunnerPool
from edgeplex.agent.upkeep import TableUpkeep

log = logging.getLogger("edgeplex.agent.models")


class ModelTable(TableRoom, TableUpkeep):
    def __init__(self, settings: AgentSettings, pool: RunnerPool, staging_root: Path) -> None:
        self._settings = settings
        self._repo = settings.model_repo
        self._pool = pool
        self._staging = staging_root
        self._entries: dict[str, ModelEntry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_upgrade = 0.0
        self._room_changed = asyncio.Event()  # set whenever device memory is released
        self.policy = make_policy(
            settings.eviction_policy,
            lru_max_models=settings.lru_max_models,
            idle_ttl_s=settings.idle_ttl_s,
        )

    # --- queries --------------------------------------------------------------------------

    def get(self, name: str) -> ModelEntry | None:
        return self._entries.get(name)

    def entries(self) -> list[ModelEntry]:
        return [self._entries[n] for n in sorted(self._entries)]

    def runner_pid(self, entry: ModelEntry) -> int | None:
        runner = self._pool.get(entry.runner_id)
        return runner.pid if runner.state == "ready" else None

    def limit_mechanism(self) -> str:
        return self._pool.limiter.mechanism

    def device_bytes(self) -> int:
        """Device bytes held now: live sessions plus reservations of loads in progress."""
        return sum(e.memory_bytes + e.reserved_bytes for e in self._entries.values())

    def host_bytes(self) -> int:
        return sum(e.staged_bytes for e in self._entries.values())

    def disk_bytes(self) -> int:
        total = 0
        for e in self._entries.values():
            with contextlib.suppress(OSError):
                total += e.source.path.stat().st_size
        return total

    def staged_dir(self, entry: ModelEntry) -> Path:
        return self._staging / entry.name / entry.version

    # --- commands -------------------------------------------------------------------------

    def discover(self) -> list[str]:
        """Add every model of the repository (UNAVAILABLE) and return their names."""
        for name, source in scan_repository(self._repo, self._settings.model_defaults).items():
            if name not in self._entries:
                entry = self._entries[name] = ModelEntry(source)
                entry.pinned = bool(source.config and source.config.pin)
        self._publish_tiers()
        return sorted(self._entries)

    def startup_order(self) -> list[str]:
        """Pinned models first, then by priority, then by name."""

        def key(e: ModelEntry) -> tuple[bool, int, str]:
            priority = e.source.config.priority if e.source.config else 0
            return (not e.pinned, -priority, e.name)

        return [e.name for e in sorted(self._entries.values(), key=key)]

    def ensure_loaded(self, name: str) -> asyncio.Future[None]:
        """Promote `name` for a request unless the operator disabled it (OIP unload)."""
        entry = self._entries.get(name)
        if entry is not None and entry.disabled:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.set_exception(Unavailable(f"model '{name}' is unloaded; load it first"))
            return future
        if entry is not None:
            entry.fast_load = True
        return self.load(name, explicit=False)

    def load(self, name: str, explicit: bool = True) -> asyncio.Future[None]:
        """Start loading `name` (re-reading it from the repository) unless it is READY at
        the same version or already loading. The future resolves when it serves, or
        raises ModelNotFound / ModelFailed / NoRoom."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        source = scan_model(self._repo, name, self._settings.model_defaults)
        entry = self._entries.get(name)
        if source is None:
            future.set_exception(ModelNotFound(f"model '{name}' is not in the repository"))
            return future
        if entry is None:
            entry = self._entries[name] = ModelEntry(source)
            entry.pinned = bool(source.config and source.config.pin)
        if explicit:
            entry.disabled = False
        if entry.state == ModelState.READY and entry.source == source:
            future.set_result(None)
            return future
        if entry.state == ModelState.FAILED and not explicit:
            future.set_exception(ModelFailed(f"model '{name}' failed to load: {entry.reason}"))
            return future
        entry.waiters.append(future)
        if entry.state == ModelState.LOADING or entry.waiting_for_room:
            return future
        if entry.state == ModelState.UNLOADING:
            entry.load_after_unload = True
            return future
        if entry.state == ModelState.READY:
            # New version on disk: finish serving the old one, then load the new one.
            entry.load_after_unload = True
            entry.drop_staged_after_unload = True
            self._begin_unload(entry, "replaced")
            return future
        if entry.source != source:
            self._drop_staged(entry)
        entry.source = source
        entry.load_crashes = 0
        self._begin_load(entry)
        return future

    def unload(self, name: str) -> asyncio.Future[None]:
        """OIP unload: stop serving `name` (queued and running requests finish first),
        keep its staged copy, and serve it again only after an explicit load."""
        entry = self._entries.get(name)
        if entry is not None:
            entry.disabled = True
        return self.demote(name, Tier.STAGED, reason="unload")

    def demote(self, name: str, tier: Tier, reason: str = "requested") -> asyncio.Future[None]:
        """Move `name` down to `tier` (staged: drop the session; cached: drop the staged
        copy too). Draining first; a no-op when it is already there or lower."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._entries.get(name)
        if entry is None:
            future.set_exception(ModelNotFound(f"model '{name}' is not in the repository"))
            return future
        if tier == Tier.LOADED:
            future.set_exception(InvalidInput("demote to 'staged' or 'cached'"))
            return future
        entry.load_after_unload = False
        if tier == Tier.CACHED:
            entry.drop_staged_after_unload = True
        if entry.state in (ModelState.UNAVAILABLE, ModelState.FAILED):
            if tier == Tier.CACHED:
                self._drop_staged(entry)
            future.set_result(None)
            return future
        entry.waiters.append(future)
        if entry.state != ModelState.UNLOADING:
            self._begin_unload(entry, reason)
        return future

    def pin(self, name: str, pinned: bool) -> None:
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        entry.pinned = pinned

    # --- runner events (called by the pool on the loop) ----------------------------------

    def runner_down(self, runner_id: str) -> None:
        for entry in self._entries.values():
            if entry.runner_id != runner_id:
                continue
            if entry.state == ModelState.LOADING:
                entry.load_crashes += 1
            if entry.state in (ModelState.READY, ModelState.LOADING):
                entry.last_measured = entry.memory_bytes or entry.last_measured
                entry.memory_bytes = 0
                if entry.load_crashes >= 2:
                    self._set_failed(entry, "its runner crashed twice while loading it")
                    continue
                entry.generation += 1
                entry.state = ModelState.LOADING
                entry.reason = "runner restarting"
                entry.reserved_bytes = entry.estimate_bytes()
                entry.ready.clear()
                entry.reload_when_runner_up = True
                METRICS.model_ready.labels(model=entry.name).set(0)
            elif entry.state == ModelState.UNLOADING:
                entry.memory_bytes = 0
        self._publish_tiers()

    def runner_up(self, runner_id: str) -> None:
        for entry in self._entries.values():
            if entry.runner_id == runner_id and entry.reload_when_runner_up:
                entry.reload_when_runner_up = False
                entry.generation += 1
                entry.fast_load = True  # back in service first, prepacked later
                self._spawn(self._load_task(entry, entry.generation, []))

    # --- transitions: load ----------------------------------------------------------------

    def _begin_load(self, entry: ModelEntry) -> None:
        if entry.source.config is None:
            self._set_failed(entry, entry.source.config_error)
            return
        needed = entry.estimate_bytes()
        try:
            victims = self._make_room(entry, needed)
        except NoRoom as exc:
            entry.state = ModelState.UNAVAILABLE
            if self._fits_someday(needed) and not entry.waiting_for_room:
                # Only other loads and demotions in flight hold the memory: wait for
                # them to settle, then try again (bounded; see _retry_when_room).
                entry.waiting_for_room = True
                self._spawn(self._retry_when_room(entry, exc))
            elif entry.waiting_for_room:
                pass  # the retry loop already running tries again on the next release
            else:
                self._resolve_waiters(entry, exc)
            return
        entry.generation += 1
        entry.state = ModelState.LOADING
        entry.reason = ""
        entry.reserved_bytes = needed
        entry.waiting_for_room = False
        self._publish_tiers()
        self._spawn(self._load_task(entry, entry.generation, victims))

    async def _load_task(
        self, entry: ModelEntry, generation: int, victims: list[asyncio.Event]
    ) -> None:
        settings = self._settings.runner
        runner = self._pool.get(entry.runner_id)
        config = entry.config
        prepack = settings.prepack_weights and not entry.fast_load
        entry.fast_load = False
        if entry.runner_id != SHARED_RUNNER and config.memory_limit:
            self._pool.memory_limits[entry.runner_id] = config.memory_limit
        try:
            for event in victims:  # their memory is free only once they are unloaded
                await event.wait()
            await asyncio.wait_for(runner.ensure_ready(), settings.start_timeout_s * 3)
            if generation != entry.generation:
                return
            staged = self.staged_dir(entry)
            reply, _ = await asyncio.wait_for(
                runner.call(
                    ipc.LoadModel(
                        req_id=self._pool.next_req_id(),
                        model=entry.name,
                        path=str(entry.source.path),
                        staged_dir=str(staged),
                        intra_op_threads=config.intra_op_threads or settings.intra_op_threads,
                        inter_op_threads=settings.inter_op_threads,
                        allow_spinning=settings.allow_spinning,
                        prepack_weights=prepack,
                        provider=settings.execution_provider,
                        device_id=settings.device_id,
                        memory_limit=config.memory_limit or 0,
                        instances=config.instance_count,
                    )
                ),
                settings.load_timeout_s,
            )
        except RunnerLost:
            return  # runner_down has already moved the model; runner_up reloads it
        except (TimeoutError, ServeError) as exc:
            self._load_done(entry, generation, None, f"load did not finish: {exc or 'timeout'}")
            return
        if isinstance(reply, ipc.ModelLoaded):
            self._load_done(entry, generation, reply, "")
        else:
            self._load_done(entry, generation, None, getattr(reply, "message", "load failed"))

    def _load_done(
        self, entry: ModelEntry, generation: int, reply: ipc.ModelLoaded | None, error: str
    ) -> None:
        if generation != entry.generation:
            return
        entry.reserved_bytes = 0
        self._room_changed.set()
        if reply is None:
            self._set_failed(entry, error)
            return
        try:
            apply_metadata(entry, reply)
        except ModelFailed as exc:
            self._set_failed(entry, exc.message)
            self._spawn(self._unload_in_runner(entry))
            return
        entry.state = ModelState.READY
        entry.reason = ""
        entry.load_crashes = 0
        # Insertion counts as a use, stamped after this load's evictions moved the
        # GDSF clock: otherwise the model could be the next victim before the
        # request that promoted it is even served.
        entry.last_used = entry.loaded_at = time.monotonic()
        entry.prepacked = reply.prepacked
        if isinstance(self.policy, GreedyDualSizeFrequency):
            entry.credit = self.policy.clock
        record_promotion(entry, reply)
        budget = self._settings.device_memory_budget
        if budget is not None and self.device_bytes() > budget:
            # Measured above its estimate: make room among serving models, or give it back.
            try:
                self._make_room(entry, entry.memory_bytes, loaded_only=True)
            except NoRoom:
                too_big = NoRoom(
                    f"model '{entry.name}' measured {entry.memory_bytes} bytes of device "
                    f"memory, more than the {budget}-byte budget can hold next to the "
                    "models that cannot be evicted"
                )
                waiters, entry.waiters = entry.waiters, []
                self.demote(entry.name, Tier.STAGED, reason="oversize")
                for future in waiters:
                    if not future.done():
                        future.set_exception(too_big)
                return
        if entry.batcher is None:
            entry.batcher = make_batcher(entry, self._pool)
        else:  # a reload starts over at the configured instance count
            entry.batcher.set_instances(entry.config.instance_count)
        METRICS.instances.labels(model=entry.name).set(entry.config.instance_count)
        entry.ready.set()
        METRICS.model_ready.labels(model=entry.name).set(1)
        log.info(
            "model %s v%s loaded from %s in %.0f ms (%d bytes)",
            entry.name,
            entry.version,
            reply.source,
            entry.load_ms,
            entry.memory_bytes,
        )
        self._enforce_host_budget()
        self._publish_tiers()
        self._resolve_waiters(entry, None)

    def _set_failed(self, entry: ModelEntry, reason: str) -> None:
        log.error("model %s failed: %s", entry.name, reason)
        entry.generation += 1
        entry.state = ModelState.FAILED
        entry.reason = reason
        entry.reserved_bytes = 0
        entry.memory_bytes = 0
        self._room_changed.set()
        entry.ready.clear()
        entry.reload_when_runner_up = False
        METRICS.model_ready.labels(model=entry.name).set(0)
        error = ModelFailed(f"model '{entry.name}' failed to load: {reason}")
        if entry.batcher is not None:
            entry.batcher.fail_queued(error)
        self._publish_tiers()
        self._resolve_waiters(entry, error)

    # --- transitions: unload / demote -------------------------------------------------------

    def _begin_unload(self, entry: ModelEntry, reason: str) -> None:
        entry.generation += 1
        entry.state = ModelState.UNLOADING
        entry.reason = ""
        entry.unloaded.clear()
        METRICS.demotions.labels(reason=reason).inc()
        self._spawn(self._unload_task(entry, entry.generation))

    async def _unload_task(self, entry: ModelEntry, generation: int) -> None:
        batcher, entry.batcher = entry.batcher, None
        if batcher is not None:
            await batcher.close(Unavailable(f"model '{entry.name}' is unloading"), drain=True)
        await self._unload_in_runner(entry)
        self._unload_done(entry, generation)

    async def _unload_in_runner(self, entry: ModelEntry) -> None:
        runner = self._pool.get(entry.runner_id)
        if runner.state == "ready":
            with contextlib.suppress(RunnerLost, TimeoutError):
                await asyncio.wait_for(
                    runner.call(ipc.UnloadModel(self._pool.next_req_id(), entry.name)), 30
                )
        if entry.runner_id != SHARED_RUNNER:
            await self._pool.retire(entry.runner_id)

    def _unload_done(self, entry: ModelEntry, generation: int) -> None:
        entry.memory_bytes = 0
        entry.unloaded.set()
        self._room_changed.set()
        if generation != entry.generation:
            self._publish_tiers()
            return
        entry.state = ModelState.UNAVAILABLE
        entry.ready.clear()
        METRICS.model_ready.labels(model=entry.name).set(0)
        if entry.drop_staged_after_unload:
            self._drop_staged(entry)
        self._publish_tiers()
        if entry.load_after_unload:
            entry.load_after_unload = False
            source = scan_model(self._repo, entry.name, self._settings.model_defaults)
            if source is not None:
                entry.source = source
                self._begin_load(entry)
                return
        self._resolve_waiters(entry, None)

    def _drop_staged(self, entry: ModelEntry) -> None:
        entry.drop_staged_after_unload = False
        if entry.staged_bytes or self.staged_dir(entry).exists():
            # Safe even if a session still maps the file: unlinked pages live on until
            # the last mapping goes.
            shutil.rmtree(self._staging / entry.name, ignore_errors=True)
            entry.staged_bytes = 0
            METRICS.demotions.labels(reason="staged_dropped").inc()
        self._publish_tiers()

    def _publish_tiers(self) -> None:
        loaded = sum(e.memory_bytes for e in self._entries.values())
        METRICS.tier_bytes.labels(tier="loaded").set(loaded)
        METRICS.tier_bytes.labels(tier="staged").set(self.host_bytes())

    def _resolve_waiters(self, entry: ModelEntry, error: ServeError | None) -> None:
        waiters, entry.waiters = entry.waiters, []
        for future in waiters:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for entry in self._entries.values():
            if entry.batcher is not None:
                await entry.batcher.close(Unavailable("the agent is shutting down"), drain=False)
        for task in list(self._tasks):
            task.cancel()
