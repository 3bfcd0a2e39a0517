"""The residency owner's effects, carried out: runner calls, staged files, and
the models' queues opened and closed (batching/queues.py holds them).

`RunnerEffects` implements contract.Effects. Each effect starts a task (or acts
at once when it is only bookkeeping of mechanism: a queue opened or paused)
and reports its result back to the owner as an event, tagged with the
generation the owner gave it. Nothing here decides anything, and nothing here
writes a record: the owner does both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edgeplex.agent.catalog.forms import ORIGINAL
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import RunnerLost, ServeError, Unavailable
from edgeplex.agent.residency.contract import Loaded, QueueLoad, Queues
from edgeplex.agent.residency.owner import Residency
from edgeplex.agent.residency.promotions import Promotions
from edgeplex.agent.residency.runner_messages import load_message, stage_message, staged_dir
from edgeplex.agent.residency.state import SHARED_RUNNER, ModelKey, ModelRecord, Phase
from edgeplex.agent.residency.variant_requests import build_variants
from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.supervisor import RunnerPool, RunnerState

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.config import AgentSettings

log = logging.getLogger("edgeplex.agent.residency")

Reply = asyncio.Future[tuple[ipc.Message, memoryview]]


class RunnerEffects:
    def __init__(
        self, settings: AgentSettings, pool: RunnerPool, queues: Queues, staging_root: Path
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._queues = queues
        self._staging = staging_root
        self.owner: Residency | None = None  # set once, by attach
        self._tasks: set[asyncio.Task[None]] = set()
        self._staged_dirs: dict[tuple[ModelKey, str, str], Path] = {}
        self.promotions = Promotions(settings.runner.execution_provider)

    def attach(self, owner: Residency) -> None:
        """The owner these effects report to (set once, right after it is built). The
        tier gauges are read from its ledger when metrics are scraped, not kept up to
        date on every event."""
        self.owner = owner
        METRICS.tier_bytes.labels(tier="loaded").set_function(owner.device_bytes)
        METRICS.tier_bytes.labels(tier="staged").set_function(owner.ledger.host_bytes)
        METRICS.hot_models.set_function(owner.ledger.hot_models)

    # --- where things are ------------------------------------------------------------------

    def staged_dir(self, record: ModelRecord, form: str = ORIGINAL) -> Path:
        """Where a form's staged copy lies (asked on every promotion: remembered)."""
        key = (record.key, record.source.digest, form)
        path = self._staged_dirs.get(key)
        if path is None:
            provider = self._settings.runner.execution_provider
            path = self._staged_dirs[key] = staged_dir(self._staging, record, form, provider)
        return path

    # --- owner.Effects ----------------------------------------------------------------------

    def load(self, record: ModelRecord, generation: int, fast: bool) -> None:
        runner = self._pool.get(record.runner_id)
        sent = None
        if runner.state == RunnerState.READY:  # (a memory limit applies when a runner starts)
            # Written in this step: the load does not wait for its task to start. (A
            # warm-up file that cannot be read now is the task's to report.)
            with contextlib.suppress(RunnerLost, ValueError):
                sent = runner.send(*self._load_message(record, record.form, fast))
        self._spawn(self._load(record, generation, fast, sent))

    def unload(self, record: ModelRecord, generation: int) -> None:
        cpu = self._settings.runner.execution_provider == "cpu"
        if cpu and record.runner_id == SHARED_RUNNER:
            # Right after the owner's step, not as a task: nothing here waits.
            asyncio.get_running_loop().call_soon(self._unload_in_order, record, generation)
        else:
            self._spawn(self._unload(record, generation))

    def serve(self, record: ModelRecord) -> None:
        self._queues.open(record, record.source, record.config.instance_count)

    def pause(self, record: ModelRecord) -> None:
        self._queues.hold(record.key, record.name)
        if record.phase == Phase.FAILED:
            error = Unavailable(f"model '{record.name}' failed: {record.reason}")
            self._queues.close(record.key, error, drain=False)

    def stage(self, record: ModelRecord, form: str = ORIGINAL) -> None:
        self._spawn(self._stage(record, form))

    def drop_staged(self, record: ModelRecord) -> None:
        # Safe even if a session still maps the file: unlinked pages live on until
        # the last mapping goes.
        for form in (ORIGINAL, *record.variants):
            shutil.rmtree(self.staged_dir(record, form), ignore_errors=True)
        METRICS.demotions.labels(reason="staged_dropped").inc()

    def prepack(self, record: ModelRecord, generation: int) -> None:
        self._spawn(self._prepack(record, generation))

    def queue_load(self, record: ModelRecord) -> QueueLoad | None:
        queue = self._queues.get(record.key)
        if queue is None:
            return None
        idle_s = time.monotonic() - queue.last_queued
        return QueueLoad(queue.depth, queue.instances, idle_s)

    def scale(self, record: ModelRecord, instances: int) -> None:
        self._spawn(self._scale(record, instances))

    def build_variants(self, record: ModelRecord, forms: list[str]) -> None:
        self._spawn(self._build_variants(record, forms))

    def reform(self, record: ModelRecord, generation: int, form: str) -> None:
        self._spawn(self._reform(record, generation, form))

    # --- the tasks --------------------------------------------------------------------------

    def _load_message(
        self, record: ModelRecord, form: str, fast: bool
    ) -> tuple[ipc.LoadModel, list[memoryview]]:
        req_id = self._pool.next_req_id()
        staged = self.staged_dir(record, form)
        return load_message(req_id, record, form, fast, staged, self._settings.runner)

    async def _load(
        self, record: ModelRecord, generation: int, fast: bool, sent: Reply | None
    ) -> None:
        owner = self.owner
        assert owner is not None
        settings = self._settings.runner
        config = record.config
        if record.runner_id != SHARED_RUNNER and config.memory_limit:
            self._pool.memory_limits[record.runner_id] = config.memory_limit
        runner = self._pool.get(record.runner_id)
        try:
            if sent is None:
                await asyncio.wait_for(runner.ensure_ready(), settings.start_timeout_s * 3)
                sent = runner.send(*self._load_message(record, record.form, fast))
            async with asyncio.timeout(settings.load_timeout_s):
                reply, _ = await sent
        except RunnerLost:
            return  # runner_down has moved the model; runner_up reloads it
        except (TimeoutError, ServeError) as exc:
            owner.load_failed(record.key, generation, f"load did not finish: {exc or 'timeout'}")
            return
        except ValueError as exc:  # a warm-up sample's file, changed since it was found
            owner.load_failed(record.key, generation, str(exc))
            return
        if not isinstance(reply, ipc.ModelLoaded):
            owner.load_failed(record.key, generation, getattr(reply, "message", "load failed"))
            return
        promote_ms = reply.load_ms
        if reply.source != "staged":
            promote_ms = reply.stages.get("create", 0) + reply.stages.get("warmup", 0)
        self.promotions.record(record, reply, record.form)
        if fast:  # a request asked for it and waits (lifecycle: waiters, not explicit)
            METRICS.cold_starts.labels(model=record.name).inc()
        log.info(
            "model %s loaded from %s in %.0f ms (%d bytes)",
            record.key,
            reply.source,
            reply.load_ms,
            reply.bytes,
        )
        owner.load_done(
            record.key,
            generation,
            Loaded(
                bytes=reply.bytes,
                promote_s=promote_ms / 1000,
                staged_bytes=reply.staged_bytes,
                prepacked=reply.prepacked,
                source=reply.source,
                on_demand=fast,
            ),
        )

    async def _unload(self, record: ModelRecord, generation: int) -> None:
        owner = self.owner
        assert owner is not None
        _count_eviction(record)
        runner = self._pool.get(record.runner_id)
        unload = ipc.UnloadModel(self._pool.next_req_id(), str(record.key))
        # Empty: the model had no leases left.
        await self._queues.closed(record.key, Unavailable(f"model '{record.name}' is unloading"))
        if runner.state == RunnerState.READY:
            with contextlib.suppress(RunnerLost, TimeoutError):
                await asyncio.wait_for(runner.call(unload), 30)
        if record.runner_id != SHARED_RUNNER:
            await self._pool.retire(record.runner_id)
        owner.unload_done(record.key, generation)

    def _unload_in_order(self, record: ModelRecord, generation: int) -> None:
        """A CPU session of the shared runner leaves: host RAM, and frames handled in
        order, so a successor's load written after this is read once this session is
        released. The model has no leases, so its queue is empty: no batch can follow
        the unload, and the room is free now. The queue is kept, paused, for the
        model's next promotion (under over-commit a model comes and goes many times a
        second)."""
        runner = self._pool.get(record.runner_id)
        if runner.state != RunnerState.READY:
            self._spawn(self._unload(record, generation))
            return
        owner = self.owner
        assert owner is not None
        _count_eviction(record)
        self._queues.hold(record.key, record.name)
        with contextlib.suppress(RunnerLost):
            runner.post(ipc.UnloadModel(self._pool.next_req_id(), str(record.key)))
        owner.unload_done(record.key, generation)
        if owner.ledger.by_key.get(record.key) is not record:  # retired: nothing comes back
            self._queues.close(record.key, Unavailable(f"model '{record.name}' was replaced"), True)

    async def _stage(self, record: ModelRecord, form: str) -> None:
        owner = self.owner
        assert owner is not None
        staged = 0
        try:
            runner = self._pool.get(SHARED_RUNNER)
            await runner.ensure_ready()
            reply, _ = await runner.call(
                stage_message(
                    self._pool.next_req_id(),
                    record,
                    form,
                    self.staged_dir(record, form),
                    self._settings.runner,
                )
            )
            if isinstance(reply, ipc.ModelStaged):
                staged = reply.staged_bytes
            else:
                log.warning("staging %s failed: %s", record.key, getattr(reply, "message", ""))
        except (RunnerLost, ServeError):
            pass
        owner.staged(record.key, staged, form)

    async def _prepack(self, record: ModelRecord, generation: int) -> None:
        owner = self.owner
        assert owner is not None
        delta: int | None = None
        try:
            reply, _ = await self._pool.get(record.runner_id).call(
                ipc.Prepack(self._pool.next_req_id(), str(record.key))
            )
        except RunnerLost:
            reply = None
        if isinstance(reply, ipc.Prepacked):
            delta = reply.bytes_delta
            METRICS.promotion_stage_duration.labels(stage="prepack").observe(reply.ms / 1000)
        elif reply is not None:
            log.warning("prepacking %s failed: %s", record.key, getattr(reply, "message", ""))
        owner.prepacked(record.key, generation, delta)
        METRICS.model_memory.labels(model=record.name).set(record.device_bytes)

    async def _build_variants(self, record: ModelRecord, forms: list[str]) -> None:
        owner = self.owner
        assert owner is not None
        digest = record.source.digest  # the one built from, whatever the scan finds meanwhile
        reports = await build_variants(self._pool, self._settings, record, forms)
        owner.variants_built(record.key, digest, reports)

    async def _reform(self, record: ModelRecord, generation: int, form: str) -> None:
        owner = self.owner
        assert owner is not None
        loaded: Loaded | None = None
        try:
            message, samples = self._load_message(record, form, fast=False)
            message.swap = True
            reply, _ = await asyncio.wait_for(
                self._pool.get(record.runner_id).call(message, samples),
                self._settings.runner.load_timeout_s,
            )
        except (RunnerLost, TimeoutError, ServeError, ValueError):
            reply = None
        if isinstance(reply, ipc.ModelLoaded):
            self.promotions.record(record, reply, form)
            loaded = Loaded(
                reply.bytes, reply.load_ms / 1000, reply.staged_bytes, reply.prepacked, reply.source
            )
            log.info(
                "model %s now serves as %s (%d bytes)", record.key, form or "original", reply.bytes
            )
        elif reply is not None:
            log.warning(
                "model %s: swap to %s failed: %s",
                record.key,
                form or "original",
                getattr(reply, "message", ""),
            )
        owner.reformed(record.key, generation, form, loaded)

    async def _scale(self, record: ModelRecord, target: int) -> None:
        owner = self.owner
        assert owner is not None
        try:
            reply, _ = await self._pool.get(record.runner_id).call(
                ipc.SetInstances(self._pool.next_req_id(), str(record.key), target)
            )
        except RunnerLost:
            reply = None
        owner.scaled(record.key)
        if isinstance(reply, ipc.InstancesSet) and reply.instances:
            log.info("model %s: %d instances", record.key, reply.instances)
            self._queues.set_instances(record.key, record.name, reply.instances)

    # --- helpers ----------------------------------------------------------------------------

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _count_eviction(record: ModelRecord) -> None:
    METRICS.demotions.labels(reason="evicted").inc()
    METRICS.model_ready.labels(model=record.name).set(0)
