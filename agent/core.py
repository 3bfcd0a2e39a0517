"""What both front doors serve: the protocol-neutral agent API.

grpc_api.py and http_api.py decode wire requests into calls on `Agent` and
encode what it returns; neither touches models or runners directly. All
methods run on the agent's event loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeplex import __version__
from edgeplex.agent.batcher import Request, batch_key
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.entry import ModelEntry, ModelState, Tier
from edgeplex.agent.errors import (
    DeadlineExceeded,
    InvalidInput,
    ModelFailed,
    ModelNotFound,
    ServeError,
    Unavailable,
)
from edgeplex.agent.forward import Router
from edgeplex.agent.load_window import LoadWindow
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.models import ModelTable
from edgeplex.agent.repository import valid_name
from edgeplex.agent.tensors import check_against_spec

EXTENSIONS = ["model_repository", "statistics", "binary_tensor_data", "edgeplex_status"]


@dataclass
class InferInput:
    name: str
    datatype: str
    shape: list[int]
    array: np.ndarray


@dataclass
class InferResult:
    entry: ModelEntry
    outputs: dict[str, np.ndarray]
    # The tier this request had to promote the model from ("staged" or "cached"),
    # or "" when it was loaded already.
    cold_start: str


class Agent:
    def __init__(self, settings: AgentSettings, table: ModelTable) -> None:
        self.settings = settings
        self.table = table
        self.draining = False
        self.started = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.load_window = LoadWindow()
        self.router: Router | None = None  # set in fleet mode (forward.py)
        self.region = settings.fleet.region or "local"

    # --- health and metadata -------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.started and not self.draining

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "edgeplex", "version": __version__, "extensions": EXTENSIONS}

    def entry(self, name: str, version: str = "") -> ModelEntry:
        entry = self.table.get(name)
        if entry is None:
            raise ModelNotFound(f"model '{name}' is not in the repository")
        if version and version != entry.version:
            raise ModelNotFound(
                f"model '{name}' has no version '{version}' (serving version {entry.version})"
            )
        return entry

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            entry = self.entry(name, version)
        except ModelNotFound:
            return False
        return entry.state == ModelState.READY and not self.draining

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        entry = self.entry(name, version)
        if entry.state != ModelState.READY and not entry.inputs:
            raise Unavailable(
                f"model '{name}' is {entry.state}; its metadata is known once it has loaded"
            )
        return {
            "name": entry.name,
            "versions": [entry.version],
            "platform": "onnxruntime_onnx",
            "inputs": [t.to_json() for t in entry.inputs],
            "outputs": [t.to_json() for t in entry.outputs],
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        entry = self.entry(name, version)
        self.model_metadata(name, version)  # same availability rule

        def dims(shape: tuple[int, ...]) -> list[int]:
            return list(shape[1:] if entry.max_batch_size else shape)

        config = entry.config
        return {
            "name": entry.name,
            "platform": "onnxruntime_onnx",
            "backend": "onnxruntime",
            "max_batch_size": entry.max_batch_size,
            "input": [
                {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": dims(t.shape)}
                for t in entry.inputs
            ],
            "output": [
                {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": dims(t.shape)}
                for t in entry.outputs
            ],
            "dynamic_batching": {"max_queue_delay_microseconds": config.max_queue_delay_us},
            "edgeplex": config.model_dump(),
        }

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        entries = [self.entry(name, version)] if name else self.table.entries()
        return [e.stats.to_json(e.name, e.version) for e in entries]

    # --- repository ---------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return [
            {"name": e.name, "version": e.version, "state": str(e.state), "reason": e.reason}
            for e in self.table.entries()
            if not ready_only or e.state == ModelState.READY
        ]

    async def load(self, name: str) -> None:
        await self.table.load(name)

    async def unload(self, name: str) -> None:
        await self.table.unload(name)

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "name": e.name,
                "version": e.version,
                "state": str(e.state),
                "reason": e.reason,
                "runner": e.runner_id,
                "runner_pid": self.table.runner_pid(e),
                "memory_bytes": e.memory_bytes,
                "load_ms": round(e.load_ms, 3),
                "tier": str(e.tier),
                "staged_bytes": e.staged_bytes,
                "last_promotion": {"source": e.last_source, "stages_ms": e.stages},
                "max_batch_size": e.max_batch_size,
                "instances": e.batcher.instances if e.batcher else 0,
                "prepacked": e.prepacked if e.state == ModelState.READY else None,
                "queue_depth": e.batcher.depth if e.batcher else 0,
                "isolation": e.config.isolation if e.source.config else None,
                "priority": e.config.priority if e.source.config else None,
                "pinned": e.pinned,
            }
            for e in self.table.entries()
        ]

    def memory(self) -> dict[str, Any]:
        s = self.settings
        return {
            "policy": s.eviction_policy,
            "runner_memory_limits": self.table.limit_mechanism(),
            "tiers": {
                "loaded": {"bytes": self.table.device_bytes(), "budget": s.device_memory_budget},
                "staged": {"bytes": self.table.host_bytes(), "budget": s.host_memory_budget},
                "cached": {"bytes": self.table.disk_bytes(), "budget": s.disk_cache_budget},
            },
        }

    def pin(self, name: str, pinned: bool) -> None:
        self.table.pin(name, pinned)

    async def demote(self, name: str, tier: str) -> None:
        try:
            target = Tier(tier)
        except ValueError:
            raise InvalidInput(f"unknown tier '{tier}' (use 'staged' or 'cached')") from None
        if target == Tier.LOADED:
            raise InvalidInput("demote to 'staged' or 'cached'; `load` promotes")
        await self.table.demote(name, target)

    # --- inference ----------------------------------------------------------------------------

    async def infer(
        self,
        name: str,
        version: str,
        inputs: list[InferInput],
        outputs: list[str] | None,
        timeout_s: float | None,
        origin: str = "",
    ) -> InferResult:
        """Validate, queue, wait for the batch result. Raises ServeError subclasses.
        `origin` is the region the request came from (a forwarder's header); the
        agent's own region when empty. It feeds the demand the control plane sees."""
        started = time.monotonic()
        METRICS.requests.labels(model=name).inc()
        entry: ModelEntry | None = None
        self._inflight += 1
        self._idle.clear()
        try:
            if self.draining:
                raise Unavailable("the agent is shutting down")
            entry = self.entry(name, version)
            self.table.touch(entry)
            cold_start = await self._promote_if_needed(entry, timeout_s)
            if entry.batcher is None and not entry.disabled:
                # Evicted between its promotion and this request's turn: promote again.
                cold_start = await self._promote_if_needed(entry, timeout_s) or cold_start
            request = self._admit(entry, inputs, outputs, timeout_s)
            assert entry.batcher is not None
            entry.batcher.submit(request)
            # A timer, not wait_for: one fewer task and loop hop on the hot path. The
            # batcher skips requests whose future is already done.
            timer = asyncio.get_running_loop().call_at(
                request.deadline, _time_out, request.future, name
            )
            try:
                result = await request.future
            finally:
                timer.cancel()
            return InferResult(entry, result, cold_start)
        except ServeError as exc:
            METRICS.failures.labels(model=name, code=exc.grpc_code.name).inc()
            if entry is not None:
                entry.stats.record_failure(time.monotonic() - started)
            raise
        finally:
            elapsed = time.monotonic() - started
            METRICS.request_duration.labels(model=name).observe(elapsed)
            if entry is not None or valid_name(name):
                # Requests for a model this site lacks are demand the control plane
                # must see, or it would never place the model here.
                self.load_window.record(name, origin or self.region, elapsed)
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _promote_if_needed(self, entry: ModelEntry, timeout_s: float | None) -> str:
        """Load on first request: wait (bounded by the request's deadline) for the one
        load of this model in flight, starting it if needed. Returns the source tier,
        or "" when the model was servable already. A model whose runner is restarting
        keeps its queue and is not waited for here."""
        if entry.batcher is not None and entry.state in (ModelState.READY, ModelState.LOADING):
            return ""
        if entry.state == ModelState.FAILED:
            raise ModelFailed(f"model '{entry.name}' failed to load: {entry.reason}")
        source = str(entry.tier)
        limit = entry.config.timeout_ms / 1000 if entry.source.config else 30.0
        if timeout_s is not None:
            limit = min(limit, timeout_s)
        try:
            await asyncio.wait_for(asyncio.shield(self.table.ensure_loaded(entry.name)), limit)
        except TimeoutError:
            raise DeadlineExceeded(
                f"model '{entry.name}': request timed out waiting for the model to load"
            ) from None
        return source

    def _admit(
        self,
        entry: ModelEntry,
        inputs: list[InferInput],
        outputs: list[str] | None,
        timeout_s: float | None,
    ) -> Request:
        if entry.state == ModelState.FAILED:
            raise ModelFailed(f"model '{entry.name}' failed to load: {entry.reason}")
        if entry.state in (ModelState.UNAVAILABLE, ModelState.UNLOADING) or entry.batcher is None:
            raise Unavailable(f"model '{entry.name}' is not loaded")
        specs = {s.name: s for s in entry.inputs}
        given: dict[str, np.ndarray] = {}
        for tensor in inputs:
            spec = specs.get(tensor.name)
            if spec is None:
                raise InvalidInput(
                    f"model '{entry.name}' has no input '{tensor.name}'"
                    f" (inputs: {', '.join(specs)})"
                )
            if tensor.name in given:
                raise InvalidInput(f"input '{tensor.name}' is given twice")
            check_against_spec(spec, tensor.datatype, tensor.shape)
            given[tensor.name] = tensor.array
        missing = [n for n in specs if n not in given]
        if missing:
            raise InvalidInput(f"model '{entry.name}': missing input '{missing[0]}'")
        if outputs is not None:
            known = {s.name for s in entry.outputs}
            for out in outputs:
                if out not in known:
                    raise InvalidInput(f"model '{entry.name}' has no output '{out}'")
        batch = 1
        if entry.max_batch_size:
            sizes = {a.shape[0] for a in given.values()}
            if len(sizes) != 1:
                raise InvalidInput(
                    f"model '{entry.name}': inputs disagree on the batch dimension"
                    f" ({sorted(sizes)})"
                )
            batch = sizes.pop()
            if not 1 <= batch <= entry.max_batch_size:
                first = next(iter(given))
                raise InvalidInput(
                    f"input '{first}': batch size {batch} is outside 1..{entry.max_batch_size}"
                )
        limit = entry.config.timeout_ms / 1000
        if timeout_s is not None:
            if timeout_s <= 0:
                raise DeadlineExceeded(f"model '{entry.name}': request arrived past its deadline")
            limit = min(limit, timeout_s)
        loop = asyncio.get_running_loop()
        return Request(
            inputs=given,
            outputs=outputs,
            batch_size=batch,
            key=batch_key(given, entry.max_batch_size > 0),
            deadline=loop.time() + limit,
            future=loop.create_future(),
        )

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._inflight

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for in-flight ones; True if all finished."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False


def _time_out(future: asyncio.Future[dict[str, np.ndarray]], model: str) -> None:
    if not future.done():
        future.set_exception(DeadlineExceeded(f"model '{model}': request timed out"))
