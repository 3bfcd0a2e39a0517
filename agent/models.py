"""The model table: every model of the repository, its state and its runner.

State machine of one model:

    UNAVAILABLE --load--> LOADING --ok--> READY --unload--> UNLOADING --> UNAVAILABLE
                             |  ^           |
                          error |      runner lost
                             v  +-----------+   (reloaded when the runner is back)
                           FAILED --load--> LOADING

Ownership: the table is mutated only by its own methods, and only on the
agent's event loop. No method awaits between reading and writing state, so
each one is atomic; slow work (a load, a drain) runs in a task that reports
back through `_load_done` / `_unload_done`, tagged with the entry's generation
so a stale result is ignored. Front doors read entries but never write them.

Guarantees: at most one load per model is in flight; a model whose load fails
is FAILED with the reason (no path in it) and touches no other model; a model
whose load crashes its runner twice is FAILED rather than crash-looping the
runner it shares with others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from edgeplex.agent import ipc
from edgeplex.agent.batcher import Batcher
from edgeplex.agent.config import AgentSettings, ModelConfig
from edgeplex.agent.errors import (
    InferenceFailed,
    InvalidInput,
    ModelFailed,
    ModelNotFound,
    RunnerLost,
    ServeError,
    Unavailable,
)
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.repository import ModelSource, scan_model, scan_repository
from edgeplex.agent.runners import RunnerPool
from edgeplex.agent.stats import ModelStats
from edgeplex.agent.tensors import ORT_TO_OIP, TensorSpec

log = logging.getLogger("edgeplex.agent.models")

DEFAULT_MAX_BATCH_SIZE = 8
SHARED_RUNNER = "shared-0"


class ModelState(StrEnum):
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


@dataclass(eq=False)
class ModelEntry:
    source: ModelSource
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int = 0
    memory_bytes: int = 0
    load_ms: float = 0.0
    generation: int = 0
    load_crashes: int = 0
    reload_when_runner_up: bool = False
    load_after_unload: bool = False
    batcher: Batcher | None = None
    stats: ModelStats = field(default_factory=ModelStats)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def version(self) -> str:
        return self.source.version

    @property
    def config(self) -> ModelConfig:
        assert self.source.config is not None
        return self.source.config

    @property
    def runner_id(self) -> str:
        if self.source.config is not None and self.source.config.isolation == "dedicated":
            return f"dedicated-{self.name}"
        return SHARED_RUNNER


class ModelTable:
    def __init__(self, settings: AgentSettings, pool: RunnerPool) -> None:
        self._settings = settings
        self._repo = settings.model_repo
        self._pool = pool
        self._entries: dict[str, ModelEntry] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- queries --------------------------------------------------------------------------

    def get(self, name: str) -> ModelEntry | None:
        return self._entries.get(name)

    def entries(self) -> list[ModelEntry]:
        return [self._entries[n] for n in sorted(self._entries)]

    def runner_pid(self, entry: ModelEntry) -> int | None:
        runner = self._pool.get(entry.runner_id)
        return runner.pid if runner.state == "ready" else None

    # --- commands -------------------------------------------------------------------------

    def discover(self) -> list[str]:
        """Add every model of the repository (UNAVAILABLE) and return their names."""
        for name, source in scan_repository(self._repo, self._settings.model_defaults).items():
            if name not in self._entries:
                self._entries[name] = ModelEntry(source)
        return sorted(self._entries)

    def load(self, name: str) -> asyncio.Future[None]:
        """Start loading `name` (re-reading it from the repository) unless it is READY at
        the same version or already loading. The future resolves when it serves, or
        raises ModelNotFound / ModelFailed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        source = scan_model(self._repo, name, self._settings.model_defaults)
        entry = self._entries.get(name)
        if source is None:
            future.set_exception(ModelNotFound(f"model '{name}' is not in the repository"))
            return future
        if entry is None:
            entry = self._entries[name] = ModelEntry(source)
        if entry.state == ModelState.READY and entry.source == source:
            future.set_result(None)
            return future
        entry.waiters.append(future)
        if entry.state == ModelState.LOADING:
            return future
        if entry.state == ModelState.UNLOADING:
            entry.load_after_unload = True
            return future
        if entry.state == ModelState.READY:
            # New version on disk: finish serving the old one, then load the new one.
            entry.load_after_unload = True
            self._begin_unload(entry)
            return future
        entry.source = source
        entry.load_crashes = 0
        self._begin_load(entry)
        return future

    def unload(self, name: str) -> asyncio.Future[None]:
        """Stop serving `name`: queued and running requests finish first."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._entries.get(name)
        if entry is None:
            future.set_exception(ModelNotFound(f"model '{name}' is not in the repository"))
            return future
        entry.load_after_unload = False
        if entry.state in (ModelState.UNAVAILABLE, ModelState.FAILED):
            future.set_result(None)
            return future
        entry.waiters.append(future)
        if entry.state != ModelState.UNLOADING:
            self._begin_unload(entry)
        return future

    # --- runner events (called by the pool on the loop) ----------------------------------

    def runner_down(self, runner_id: str) -> None:
        for entry in self._entries.values():
            if entry.runner_id != runner_id:
                continue
            if entry.state == ModelState.LOADING:
                entry.load_crashes += 1
            if entry.state in (ModelState.READY, ModelState.LOADING):
                if entry.load_crashes >= 2:
                    self._set_failed(entry, "its runner crashed twice while loading it")
                    continue
                entry.generation += 1
                entry.state = ModelState.LOADING
                entry.reason = "runner restarting"
                entry.ready.clear()
                entry.reload_when_runner_up = True
                METRICS.model_ready.labels(model=entry.name).set(0)

    def runner_up(self, runner_id: str) -> None:
        for entry in self._entries.values():
            if entry.runner_id == runner_id and entry.reload_when_runner_up:
                entry.reload_when_runner_up = False
                self._begin_load(entry)

    # --- transitions ----------------------------------------------------------------------

    def _begin_load(self, entry: ModelEntry) -> None:
        if entry.source.config is None:
            self._set_failed(entry, entry.source.config_error)
            return
        entry.generation += 1
        entry.state = ModelState.LOADING
        entry.reason = ""
        self._spawn(self._load_task(entry, entry.generation))

    async def _load_task(self, entry: ModelEntry, generation: int) -> None:
        settings = self._settings.runner
        runner = self._pool.get(entry.runner_id)
        config = entry.config
        try:
            await asyncio.wait_for(runner.ensure_ready(), settings.start_timeout_s * 3)
            if generation != entry.generation:
                return
            reply, _ = await asyncio.wait_for(
                runner.call(
                    ipc.LoadModel(
                        req_id=self._pool.next_req_id(),
                        model=entry.name,
                        path=str(entry.source.path),
                        intra_op_threads=config.intra_op_threads or settings.intra_op_threads,
                        inter_op_threads=settings.inter_op_threads,
                        allow_spinning=settings.allow_spinning,
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
        if reply is None:
            self._set_failed(entry, error)
            return
        try:
            self._apply_metadata(entry, reply)
        except ModelFailed as exc:
            self._set_failed(entry, exc.message)
            self._spawn(self._unload_in_runner(entry))
            return
        entry.state = ModelState.READY
        entry.reason = ""
        entry.load_crashes = 0
        METRICS.model_ready.labels(model=entry.name).set(1)
        METRICS.model_memory.labels(model=entry.name).set(entry.memory_bytes)
        METRICS.load_duration.labels(model=entry.name).observe(entry.load_ms / 1000)
        if entry.batcher is None:
            entry.batcher = self._make_batcher(entry)
        entry.ready.set()
        log.info(
            "model %s v%s ready in %.0f ms (%d bytes)",
            entry.name,
            entry.version,
            entry.load_ms,
            entry.memory_bytes,
        )
        self._resolve_waiters(entry, None)

    def _apply_metadata(self, entry: ModelEntry, reply: ipc.ModelLoaded) -> None:
        def specs(items: list[list]) -> list[TensorSpec]:
            out = []
            for name, ort_type, shape in items:
                datatype = ORT_TO_OIP.get(ort_type)
                if datatype is None or datatype in ("BYTES", "BF16"):
                    raise ModelFailed(f"tensor '{name}' has type {ort_type}, not supported")
                out.append(TensorSpec(name, datatype, tuple(shape)))
            return out

        inputs, outputs = specs(reply.inputs), specs(reply.outputs)
        batchable = all(t.shape and t.shape[0] == -1 for t in inputs + outputs)
        wanted = entry.config.max_batch_size
        if wanted is None:
            max_batch = DEFAULT_MAX_BATCH_SIZE if batchable else 0
        elif wanted > 0 and not batchable:
            raise ModelFailed(
                f"max_batch_size {wanted} needs a dynamic leading dimension on every input"
                " and output, and this model has none"
            )
        else:
            max_batch = wanted
        entry.inputs, entry.outputs, entry.max_batch_size = inputs, outputs, max_batch
        entry.memory_bytes, entry.load_ms = reply.bytes, reply.load_ms

    def _make_batcher(self, entry: ModelEntry) -> Batcher:
        config = entry.config
        pool = self._pool

        async def execute(
            inputs: dict[str, np.ndarray], outputs: list[str] | None
        ) -> tuple[dict[str, np.ndarray], int]:
            descs, buffers = ipc.pack_tensors(inputs)
            runner = pool.get(entry.runner_id)
            reply, payload = await runner.call(
                ipc.Infer(pool.next_req_id(), entry.name, outputs, descs), buffers
            )
            if isinstance(reply, ipc.InferResult):
                return ipc.unpack_tensors(reply.tensors, payload), reply.compute_ns
            assert isinstance(reply, ipc.Failure)
            if reply.kind == "invalid":
                raise InvalidInput(f"model '{entry.name}': {reply.message}")
            if reply.kind == "not_loaded":
                raise RunnerLost(entry.runner_id)
            raise InferenceFailed(f"model '{entry.name}': {reply.message}")

        return Batcher(
            entry.name,
            max_batch_size=entry.max_batch_size,
            max_queue_delay_us=config.max_queue_delay_us,
            max_queue_size=config.max_queue_size,
            instance_count=config.instance_count,
            execute=execute,
            ready=entry.ready,
            stats=entry.stats,
        )

    def _set_failed(self, entry: ModelEntry, reason: str) -> None:
        log.error("model %s failed: %s", entry.name, reason)
        entry.generation += 1
        entry.state = ModelState.FAILED
        entry.reason = reason
        entry.ready.clear()
        entry.reload_when_runner_up = False
        METRICS.model_ready.labels(model=entry.name).set(0)
        error = ModelFailed(f"model '{entry.name}' failed to load: {reason}")
        if entry.batcher is not None:
            entry.batcher.fail_queued(error)
        self._resolve_waiters(entry, error)

    def _begin_unload(self, entry: ModelEntry) -> None:
        entry.generation += 1
        entry.state = ModelState.UNLOADING
        entry.reason = ""
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
        if generation != entry.generation:
            return
        entry.state = ModelState.UNAVAILABLE
        entry.ready.clear()
        METRICS.model_ready.labels(model=entry.name).set(0)
        if entry.load_after_unload:
            entry.load_after_unload = False
            source = scan_model(self._repo, entry.name, self._settings.model_defaults)
            if source is not None:
                entry.source = source
                self._begin_load(entry)
                return
        self._resolve_waiters(entry, None)

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
