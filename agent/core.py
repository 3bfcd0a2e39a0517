"""What both front doors serve: the protocol-neutral agent API.

The doors (frontdoor/grpc.py, frontdoor/http.py) turn wire requests into calls
on `Agent` and encode what it returns; an inference request enters through one
method, `Agent.handle`, which routes it once and serves or forwards it. Neither
door touches models, runners or routes. All methods run on the agent's event
loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from inspect import iscoroutine
from typing import Any, Protocol

import numpy as np
from google.protobuf.message import Message as ProtoMessage

from edgeplex import __version__
from edgeplex.agent.batching.policy import Request
from edgeplex.agent.batching.queues import Queues
from edgeplex.agent.batching.rate_limiter import RateLimiter
from edgeplex.agent.batching.sequences import (
    Flags,
    Live,
    SequenceNotHere,
    Sequences,
    UnknownSequence,
)
from edgeplex.agent.catalog.ensemble import (
    ENSEMBLE,
    Ensemble,
    Step,
    is_ensemble,
    nesting_errors,
    read_ensemble,
)
from edgeplex.agent.catalog.repository import (
    ModelSource,
    RepositoryRead,
    invalid_file,
    scan_repository_versions,
    scan_versions,
    unservable,
)
from edgeplex.agent.catalog.triton_config import (
    Message,
    PbtxtError,
    config_json,
    parse_config_json,
)
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.fleet.forward import (
    NO_ROUTE_RETRY_S,
    Forwarded,
    GrpcForward,
    HttpForward,
    HttpReply,
    Peer,
    Router,
    via_peers,
)
from edgeplex.agent.fleet.load_window import LoadWindow
from edgeplex.agent.fleet.routing import Local, Where, choose_route
from edgeplex.agent.frontdoor.gate import InflightGate
from edgeplex.agent.frontdoor.overload import OverloadWatch
from edgeplex.agent.frontdoor.shared_memory import SharedMemory
from edgeplex.agent.frontdoor.tenants import PEER, Tenants, tenants_of
from edgeplex.agent.observability import views
from edgeplex.agent.observability.access_log import ACCESS
from edgeplex.agent.observability.log_settings import LogSettings
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.observability.stats import ModelStats
from edgeplex.agent.observability.usage import Journal
from edgeplex.agent.oip import classification
from edgeplex.agent.oip.errors import (
    DeadlineExceeded,
    InvalidInput,
    ModelFailed,
    ModelNotFound,
    NotHere,
    Overloaded,
    ServeError,
    Unavailable,
)
from edgeplex.agent.oip.requests import InferInput, validate
from edgeplex.agent.oip.response_cache import OFFLOAD_BYTES, ResponseCache, nbytes
from edgeplex.agent.oip.tensors import oip_datatype
from edgeplex.agent.residency.owner import Residency
from edgeplex.agent.residency.promotions import Promotions
from edgeplex.agent.residency.state import ModelKey, ModelRecord, Phase, Tier
from edgeplex.agent.residency.tickets import Ticket
from edgeplex.agent.runners.supervisor import RunnerPool
from edgeplex.names import valid_name
from edgeplex.settings import state_dir
from edgeplex.tenants import Tenant

# Triton's protocol extensions it serves (as server metadata names them), and its own.
EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration",
    "system_shared_memory", "binary_tensor_data", "parameters", "statistics", "logging", "trace",
    "edgeplex_status",
]  # fmt: skip
DEFAULT_TIMEOUT_S = 30.0  # a request's deadline when neither it nor its model sets one

# Fetches a model no site holds into this site's repository (fleet/on_demand.py):
# (name, version, origin region, timeout_s).
FetchOnDemand = Callable[[str, str, str, float], Awaitable[None]]


def usage_journal(settings: AgentSettings) -> Journal | None:
    """The usage journal (observability/usage.py): kept where `usage_dir` says, or by
    default for an agent in a fleet (whose control plane collects it)."""
    directory = settings.usage_dir
    if directory is None and settings.fleet.control_plane:
        directory = state_dir() / "usage" / (settings.fleet.site_id or "site")
    return Journal(directory, settings.usage_interval_s) if directory is not None else None


def rate_limiter(settings: AgentSettings) -> RateLimiter | None:
    """The pool of rate limiter resources every model shares (`rate_limit:
    execution_count`, batching/rate_limiter.py), or None when rate limiting is off."""
    if settings.rate_limit == "off":
        return None
    return RateLimiter(settings.rate_limit_resources)


def count_failure(
    journal: Journal,
    tenant: str,
    model: str,
    record: ModelRecord | None,
    ticket: Ticket | None,
    request: Request | None,
    failure: str,
) -> None:
    """A request that failed here, counted under its failure reason (served requests
    are counted by their batcher, observability/usage.py). One its batcher answered
    and counted as served, whose caller then went away or whose sequence state could
    not be kept, moves from served to failed."""
    version = record.version if record is not None else ""
    bytes_in, cold = 0, ticket is not None and bool(ticket.cold_start)
    if request is not None:
        future = request.future
        if future.done() and not future.cancelled() and future.exception() is None:
            journal.record(tenant, model, version, "", requests=-1)
            cold = False  # counted with the batch
        else:
            bytes_in = sum(array.nbytes for array in request.inputs.values())
    held = record.device_bytes if record is not None else 0
    journal.record(tenant, model, version, failure, bytes_in, 0, 0.0, cold, held)


log = logging.getLogger("edgeplex.agent")


@dataclass
class InferResult:
    entry: ModelRecord | Ensemble  # what the doors read of it: its name and version
    outputs: dict[str, np.ndarray]
    # The tier this request had to promote the model from ("staged" or "cached"),
    # or "" when it was loaded already.
    cold_start: str
    variant: str = ""  # the variant that served it; "" as shipped
    served_by: str = ""  # this site's id, in fleet mode


class Decoded(Protocol):
    """A request body, decoded by its door: what the core needs of it."""

    @property
    def inputs(self) -> list[InferInput]: ...
    @property
    def outputs(self) -> list[str] | None: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def deadline_s(self) -> float | None: ...
    @property
    def sequence(self) -> Flags | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def classify(self) -> dict[str, int]: ...


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        residency: Residency,
        queues: Queues,
        runners: RunnerPool,
        promotions: Promotions,
    ) -> None:
        self.settings = settings
        # Held, not looked up per request: asyncio.get_running_loop() costs a getpid()
        # system call on every call (its fork check).
        self.loop = asyncio.get_running_loop()
        self.residency = residency
        self.queues = queues
        self.runners = runners
        self.promotions = promotions
        self.draining = False
        self.started = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.load_window = LoadWindow()
        self.router: Router | None = None  # set in fleet mode (forward.py)
        self.on_demand: FetchOnDemand | None = None  # set in fleet mode (on_demand.py)
        self.region = settings.fleet.region or "local"
        doors = settings.doors
        self.overload = OverloadWatch(doors.shed_loop_lag_s, doors.shed_memory_available)
        self.gate = InflightGate(
            settings.max_inflight_requests, settings.max_inflight_bytes, self.overload.reason
        )
        self.gpu = settings.runner.execution_provider == "cuda"  # KIND_GPU needs it
        security = settings.security
        self.tenants = Tenants(tenants_of(security), security.anonymous)  # who calls, limits
        self.log_settings = LogSettings(on_level=runners.set_log_level)  # Triton's extension
        self.usage = queues.usage  # what each tenant used (None: not kept)
        self.shared_memory = SharedMemory(settings.shared_memory, self.gpu)  # Triton's extension
        self.overrides: dict[str, Message] = {}  # config given with a load, by model
        self.unservable: dict[str, str] = {}  # model folders with nothing to serve: why
        # The last read of each folder, reused while its stamp holds: written whole by
        # the loop (discover) or poll's thread; an entry from an older read is only
        # ever reused for a folder whose files are still as they were then.
        self._scanned: dict[str, list[ModelSource]] = {}
        self.discoveries = 0  # repository reads applied (a poll's read may be overtaken)
        self.ensembles: dict[str, Ensemble] = {}  # Triton ensembles, run by this core
        self.ensembles_off: set[str] = set()  # unloaded (explicit mode) until loaded
        # Live sequences of stateful models; each holds its model resident.
        self.sequences = Sequences(self.residency.hold, self.residency.unhold)
        # Answers kept by what was asked, for models that enable it (Triton's cache).
        budget = settings.response_cache_bytes
        self.response_cache = ResponseCache(budget) if budget > 0 else None

    # --- health and metadata -------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Serving: started, not draining, and some runner can serve (or none is
        needed yet)."""
        return self.started and not self.draining and self.runners.can_serve()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "edgeplex", "version": __version__, "extensions": EXTENSIONS}

    def metric_label(self, name: str) -> str:
        """`name` as a metric label: only models in the repository get a series."""
        return name if self.residency.get(name) is not None else ""

    def entry(self, name: str, version: str = "") -> ModelRecord:
        record = self.residency.get(name, version)
        if record is None:
            serving = self.residency.get(name)
            if serving is not None and version:
                raise ModelNotFound.unknown(name, version, f"serving version {serving.version}")
            raise ModelNotFound.unknown(name)
        return record

    def ensemble(self, name: str, version: str = "") -> Ensemble | None:
        """The ensemble `name` (None: not an ensemble); NOT_FOUND for a version of it
        that it is not."""
        ensemble = self.ensembles.get(name)
        if ensemble is not None and version and version != ensemble.version:
            raise ModelNotFound.unknown(name, version, f"serving version {ensemble.version}")
        return ensemble

    def why_not_served(self, record: ModelRecord) -> str:
        """Why a request to this version would not be served ("": it would, on the
        device or promoted there first): failed, unloaded, or too big for the device
        budget beside the pinned models."""
        if record.phase == Phase.FAILED:
            return record.reason or "failed"
        if record.disabled:
            return record.reason or "unloaded"
        return self.residency.no_room(record)

    def _index_entry(self, record: ModelRecord) -> dict[str, Any]:
        """A version as the repository index lists it: READY while it is served."""
        why = self.why_not_served(record)
        state = record.public_state() if why else "READY"
        return {"name": record.name, "version": record.version, "state": state,
                "reason": why or record.reason or _where(record)}  # fmt: skip

    def model_ready(self, name: str, version: str = "") -> bool:
        """Triton's model readiness: a request to it is served, on the device or
        promoted there first. Over-commit keeps every model servable that is neither
        unloaded nor failed; which tier it is in is the status's to say."""
        try:
            ensemble = self.ensemble(name, version)
            if ensemble is not None:
                return self._ensemble_ready(ensemble)
            entry = self.entry(name, version)
        except ModelNotFound:
            return False
        return not self.why_not_served(entry) and not self.draining

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        ensemble = self.ensemble(name, version)
        if ensemble is not None:
            return {
                "name": name,
                "versions": [ensemble.version],
                "platform": ENSEMBLE,
                "inputs": [ensemble.tensor_json(t) for t in ensemble.inputs],
                "outputs": [ensemble.tensor_json(t) for t in ensemble.outputs],
            }
        entry = self.entry(name, version)
        if not entry.outputs:
            raise Unavailable(f"model '{name}' is {entry.public_state()}: {entry.reason}")
        # As Triton answers: every version the model serves when none is named.
        served = [entry] if version else self.residency.every_version(name)
        return {
            "name": entry.name,
            "versions": [e.version for e in served],
            "platform": "onnxruntime_onnx",
            "inputs": [t.to_json() for t in entry.inputs],
            "outputs": [t.to_json() for t in entry.outputs],
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        ensemble = self.ensemble(name, version)
        if ensemble is not None:
            return ensemble.config_json()
        entry = self.entry(name, version)
        self.model_metadata(name, version)  # same availability rule
        return config_json(entry)

    def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Triton's trace extension: the settings of the agent or of `model` (a model
        or ensemble it knows), changed first by `changes` when given."""
        if model and model not in self.ensembles:
            self.entry(model)  # NOT_FOUND for an unknown model
        traces = ACCESS.traces
        if changes:
            return traces.update(changes, model or None)
        return traces.view(model or None)

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """OIP statistics of every version of every model, of every version of `name`,
        or of that one version; an ensemble's are its requests end to end."""
        ensemble = self.ensemble(name, version)
        if ensemble is not None:
            return [self._ensemble_stats(ensemble).to_json(name, ensemble.version)]
        if name and version:
            entries = [self.entry(name, version)]
        elif name:
            self.entry(name)  # NOT_FOUND for an unknown model
            entries = self.residency.every_version(name)
        else:
            entries = self.residency.every_version()
        found = [self.queues.stats(e.key).to_json(e.name, e.version) for e in entries]
        if not name:
            found += [self._ensemble_stats(e).to_json(e.name, e.version) for e in self._ensembles()]
        return found

    def _ensembles(self) -> list[Ensemble]:
        return [e for n, e in sorted(self.ensembles.items()) if n not in self.ensembles_off]

    def _ensemble_stats(self, ensemble: Ensemble) -> ModelStats:
        """An ensemble's own statistics, kept with the models' (a name is a model or an
        ensemble, never both): its requests end to end; its steps count their own."""
        return self.queues.stats(ModelKey(ensemble.name, ensemble.version))

    def model_counts(self) -> list[tuple[str, str, ModelStats, int]]:
        """Each model version's statistics and its pending requests (queued, waiting
        for the model's promotion, or a sequence's START waiting for a slot), for
        Triton's metrics."""
        queues, sequences = self.queues, self.sequences

        def pending(e: ModelRecord) -> int:
            return queues.pending(e.key) + len(e.waiters) + sequences.counts(*e.key)[1]

        return [
            (e.name, e.version, queues.stats(e.key), pending(e))
            for e in self.residency.every_version()
        ] + [(e.name, e.version, self._ensemble_stats(e), 0) for e in self._ensembles()]

    # --- repository ---------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """OIP's fields for every version served, plus the form serving and the
        variants' figures where a model has variants (the gRPC door sends OIP's fields
        only). A version is READY while a request to it is served (model_ready), and
        its reason says where it is when that is not on the device. Folders with
        nothing servable are listed as UNAVAILABLE with the reason, as Triton lists
        them."""
        index = [
            self._index_entry(e) | views.forms(e)
            for e in self.residency.every_version()
            if not ready_only or not self.why_not_served(e)
        ]
        for ensemble in self.ensembles.values():
            ready = self._ensemble_ready(ensemble)
            if ready or not ready_only:
                why = "unloaded" if ensemble.name in self.ensembles_off else ""
                state = "READY" if ready else "UNAVAILABLE"
                index.append(
                    {"name": ensemble.name, "version": ensemble.version, "state": state,
                     "reason": why}
                )  # fmt: skip
        if not ready_only:
            index += [
                {"name": name, "version": "", "state": "UNAVAILABLE", "reason": why}
                for name, why in self.unservable.items()
            ]
        return sorted(index, key=lambda m: (m["name"], len(m["version"]), m["version"]))

    async def load(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """OIP load: re-read the model from the repository and serve it. `config`
        (Triton's override, JSON) replaces its config.pbtxt until a load without one;
        a model serving under another config is unloaded and loaded again."""
        if files:  # never written to disk: models come from the repository or the fleet
            bad = invalid_file(files)
            if bad is not None:  # as Triton answers it (INTERNAL), which its examples check
                raise ServeError(
                    f"failed to load '{name}', failed to poll from model repository: "
                    f"Invalid file path: {bad[:80]!r}"
                )
            raise InvalidInput(
                f"failed to load '{name}', the 'files' parameter is not supported: put the "
                "model's files in the repository (or publish them to the fleet) and load it "
                "by name"
            )
        ensemble = self.ensembles.get(name)
        if ensemble is not None and config is not None:
            raise InvalidInput(
                f"failed to load '{name}': a config given with the load is not supported for "
                "an ensemble; change its config.pbtxt in the repository"
            )
        if ensemble is not None:  # as Triton: its steps' models are loaded with it
            for model in ensemble.models:
                await self.load(model)
            self.ensembles_off.discard(name)
            return
        override = None
        if config is not None:
            try:
                override = parse_config_json(config)
            except PbtxtError as exc:
                raise InvalidInput(
                    f"failed to load '{name}', failed to parse the model config: {exc}"
                ) from None
        versions = self._scan(name, override)
        if not versions:
            why = self.unservable.get(name, "no model folder of that name")
            raise ModelNotFound(
                f"failed to load '{name}', failed to poll from model repository: {why}"
            )
        if override is None:
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = override
        await self._serve_anew(versions)

    async def _serve_anew(self, versions: list[ModelSource]) -> None:
        """Serve a model from `versions` as read now; one serving from another source
        (another config, artifact or version) is unloaded first and loaded again."""
        name = versions[0].name
        record = self.residency.get(name)
        if record is not None and record.phase == Phase.READY and record.source != versions[0]:
            await self._settled(self.residency.demote(name, Tier.STAGED))
        self._know(versions)
        await self._settled(self.residency.load(name))

    def _scan(self, name: str, override: Message | None = None) -> list[ModelSource]:
        settings = self.settings
        return self._runnable(
            scan_versions(settings.model_repo, name, settings.model_defaults, self.gpu, override)
        )

    async def place(self, name: str) -> None:
        """Placement asks for `name` here: serve it, unless the operator unloaded it or
        its load failed (an explicit load retries those)."""
        await self._settled(self.residency.load(name, explicit=False))

    def discover(self) -> list[str]:
        """Know every model of the repository (new ones and new versions). With
        model_control_mode explicit, a model new to the agent starts unloaded."""
        return list(self._discover(self._read_repository(dict(self.overrides))))

    def _read_repository(self, overrides: dict[str, Message]) -> RepositoryRead:
        """The repository as it is now: file reads only, so poll runs it off the loop.
        Folders unchanged since the last read are not read again."""
        repo = self.settings.model_repo
        found = scan_repository_versions(
            repo, self.settings.model_defaults, self.gpu, self._scanned
        )
        self._scanned = dict(found)
        for name, override in overrides.items():
            found[name] = self._scan(name, override) or found.get(name, [])
        found = {name: self._runnable(versions) for name, versions in found.items() if versions}
        return RepositoryRead(found, unservable(repo, found))

    def _runnable(self, versions: list[ModelSource]) -> list[ModelSource]:
        """`versions`, each failed with the reason where its rate limiter resources
        exceed what the agent's pool holds (Triton fails such a model's load too)."""
        limiter = self.queues.limiter
        if limiter is None:
            return versions
        out = []
        for source in versions:
            why = limiter.shortfall(source.config.rate_limit_resources) if source.config else ""
            out.append(replace(source, config=None, config_error=why) if why else source)
        return out

    def _discover(self, read: RepositoryRead) -> dict[str, list[ModelSource]]:
        """Know the models of `read`; returns every servable model's versions."""
        self.discoveries += 1
        explicit = self.settings.model_control_mode == "explicit"
        for name, versions in read.found.items():
            new = self.residency.get(name) is None
            self._know(versions)
            if new and explicit:
                self.residency.unload(name)
        self.unservable = read.unservable
        self._discover_ensembles(set(read.found), explicit)
        return read.found

    def _discover_ensembles(self, models: set[str], explicit: bool) -> None:
        """The repository's ensembles, read anew; one that cannot run is listed as
        unservable with the reason. In explicit mode a new one starts unloaded."""
        repo = self.settings.model_repo
        folders = [n for n in self.unservable if is_ensemble(repo / n)]
        found = {}
        for name in folders:
            try:
                found[name] = read_ensemble(repo / name, models | set(folders))
                del self.unservable[name]
            except ValueError as exc:
                self.unservable[name] = f"ensemble: {exc}"
        for name, why in nesting_errors(found, MAX_ENSEMBLE_DEPTH).items():
            del found[name]
            self.unservable[name] = f"ensemble: {why}"
        for name, ensemble in found.items():
            if ensemble != self.ensembles.get(name):  # new or changed: said once
                for warning in ensemble.warnings:
                    log.warning("ensemble %s: %s", name, warning)
        load = self.settings.load_model
        for name in found:
            if explicit and name not in self.ensembles and name not in load and "*" not in load:
                self.ensembles_off.add(name)
        self.ensembles = found

    def _ensemble_ready(self, ensemble: Ensemble, depth: int = 0) -> bool:
        """Whether an ensemble would run: loaded (explicit mode), and every step's
        model known and not failed (models load on demand)."""
        if ensemble.name in self.ensembles_off or depth > MAX_ENSEMBLE_DEPTH or self.draining:
            return False
        for model in ensemble.models:
            inner = self.ensembles.get(model)
            if inner is not None:
                if not self._ensemble_ready(inner, depth + 1):
                    return False
                continue
            record = self.residency.get(model)
            if record is None or self.why_not_served(record):
                return False
        return True

    async def poll(self) -> None:
        """One rescan of the repository (model_control_mode poll): new models and
        versions are known, a model whose folder is gone is unloaded, and a loaded
        model whose files or config changed is loaded again from them."""
        before = self.discoveries
        read = await asyncio.to_thread(self._read_repository, dict(self.overrides))
        if self.discoveries != before:  # a fleet install read it meanwhile: next time
            return
        found = self._discover(read)
        for record in list(self.residency.records()):
            name = record.name
            versions = found.get(name)
            if versions is None:
                if not record.disabled:
                    await self._settled(self.residency.unload(name))
            elif record.phase == Phase.READY and not record.disabled:
                newest = versions[0]
                if newest.version == record.version and newest != record.source:
                    await self._serve_anew(versions)

    def _know(self, versions: list[ModelSource]) -> None:
        """A model's versions to serve, newest first: the newest answers requests that
        name no version; the others stay for requests that name theirs."""
        newest, *older = versions
        for source in older:
            self.residency.add_version(source)
        self.residency.add(newest, keep={s.version for s in older})

    async def unload(self, name: str, dependents: bool = False) -> None:
        """OIP unload. An ensemble alone, its steps' models staying, unless `dependents`
        (Triton's unload_dependents): then its steps go too, but those that an ensemble
        still served runs."""
        ensemble = self.ensembles.get(name)
        if ensemble is None:
            await self._settled(self.residency.unload(name))
            return
        self.ensembles_off.add(name)
        if dependents:
            served = [e for e in self.ensembles.values() if e.name not in self.ensembles_off]
            needed = {model for e in served for model in e.models}
            for model in ensemble.models:
                if model not in needed:
                    await self.unload(model, dependents=True)

    async def _settled(self, ticket: Ticket) -> None:
        await ticket.wait(self.loop)
        if ticket.error is not None:
            raise ticket.error

    def status(self) -> list[dict[str, Any]]:
        return views.status(
            self.residency, self.queues, self.runners, self.promotions, self.sequences
        )

    def memory(self) -> dict[str, Any]:
        view = views.memory(self.settings, self.residency, self.runners)
        if self.queues.limiter is not None:  # rate_limit: execution_count
            view["rate_limiter"] = self.queues.limiter.view()
        return view

    def set_device_budget(self, budget: int | None) -> None:
        """A new device budget, at run time (a GPU shared anew, an operator's change):
        models leave until the rest fit, or models waiting for room load."""
        self.settings.device_memory_budget = budget
        self.residency.set_device_budget(budget)

    def pin(self, name: str, pinned: bool) -> None:
        self.residency.pin(name, pinned)

    async def demote(self, name: str, tier: str, after_sequences: bool = False) -> None:
        """`name` down to `tier` (staged or cached) once its admitted requests are
        answered; `after_sequences` (placement's): after its live sequences too, for
        a while (Residency.demote)."""
        try:
            target = Tier(tier)
        except ValueError:
            raise InvalidInput(f"unknown tier '{tier}' (use 'staged' or 'cached')") from None
        if target == Tier.LOADED:
            raise InvalidInput("demote to 'staged' or 'cached'; `load` promotes")
        await self._settled(self.residency.demote(name, target, after_sequences))

    # --- routing --------------------------------------------------------------------------

    def route(self, name: str, forwarded: bool, origin: str) -> list[Peer]:
        """Where this request goes, decided once for both front doors: [] to serve it
        here, else the peers to try in order. Raises Unavailable when no site can."""
        router = self.router
        if router is None:
            return []
        record = self.residency.get(name)
        local = None
        if record is not None and record.phase != Phase.FAILED and not record.disabled:
            estimate = self.residency.ledger.promote_estimate(record)
            local = Local(record.phase == Phase.READY, estimate, sequences=record.holds > 0)
        route = choose_route(local, router.options(name), forwarded)
        if route.where == Where.FORWARD:
            return router.peers(name, route.peers)
        if route.where == Where.LOCAL:
            return []
        if record is None and not forwarded and self.on_demand is not None and valid_name(name):
            return []  # fetched and loaded here, if the fleet's catalog has it (infer)
        if valid_name(name):  # demand for a model no site has: the control plane must see it
            self.load_window.record(name, origin or self.region, 0.0)
        if forwarded:  # the forwarder's routes are out of date: it tries elsewhere
            raise NotHere(f"model '{name}' is not at this site (routes are changing)")
        if record is not None:
            raise Unavailable(f"model '{name}' cannot be served at this site now")
        error = Unavailable(f"no site serves model '{name}' now; retry in {NO_ROUTE_RETRY_S:g} s")
        error.retry_after_s = NO_ROUTE_RETRY_S
        raise error

    async def _peers_to_ask(
        self, name: str, version: str, header: Callable[[str], str | None]
    ) -> list[Peer]:
        """The peers to ask about a model this site does not know (its metadata,
        config or readiness), nearest first; [] when this site answers: the model
        is known here, or is a peer's question (answered here, at one hop), or no
        other site holds it. A model of the fleet's catalog that no site holds yet
        is fetched here first, as its first request would fetch it."""
        router = self.router
        if router is None or name in self.ensembles or self.residency.get(name) is not None:
            return []
        if router.hop(header)[0]:
            return []
        peers = router.holders(name)
        if not peers and self.on_demand is not None and valid_name(name):
            await self.on_demand(name, version, self.region, DEFAULT_TIMEOUT_S)
        return peers

    async def ask_http(
        self, name: str, version: str, path: str, header: Callable[[str], str | None]
    ) -> HttpReply | None:
        """A GET about `name` that a peer answers (`_peers_to_ask`): its answer as the
        peer gave it; None: this site answers."""
        peers = await self._peers_to_ask(name, version, header)
        if not peers or self.router is None:
            return None
        return await self.router.ask_http(path, peers)

    async def ask_grpc(
        self,
        name: str,
        version: str,
        method: str,
        request: ProtoMessage,
        header: Callable[[str], str | None],
    ) -> ProtoMessage | None:
        """The gRPC counterpart of ask_http (`method`: ModelMetadata, ModelConfig,
        ModelReady)."""
        peers = await self._peers_to_ask(name, version, header)
        if not peers or self.router is None:
            return None
        return await self.router.ask_grpc(method, request, peers)

    # --- inference ----------------------------------------------------------------------------

    async def handle(
        self,
        name: str,
        version: str,
        header: Callable[[str], str | None],
        forward: HttpForward | GrpcForward | None,
        decode: Callable[[], Decoded | Coroutine[Any, Any, Decoded]],
        traceparent: Callable[[], str] = str,
        arrived: float | None = None,
        caller: str = "",
        step_of: str | None = None,
    ) -> InferResult | Forwarded:
        """The one entry point of an inference request, for both doors.

        The route is decided once: here, or the peers to try, with the request as
        received (`forward`). A request served here is decoded (`decode`, the
        door's), validated, admitted through residency (a lease, or a wait for the
        model's promotion), queued, and awaited; all within one deadline that starts
        at `arrived`, the loop.time() the door had the request's headers (now when
        the door cannot tell), and is the earliest of the caller's and the model's.
        `header` reads the request's headers (its hop headers count only from fleet
        peers); `traceparent` gives the header a forward carries (this hop's span
        id is drawn only when one is made). `caller` is the tenant the door's
        credentials check found ("": found here); the request is admitted under
        that tenant's limits before it is decoded (frontdoor/tenants.py). Raises
        ServeError subclasses."""
        loop = self.loop
        arrived = loop.time() if arrived is None else arrived
        tenants = self.tenants
        admit = step_of is None  # not for an ensemble's step: its ensemble was
        # Whose request: the doors pass it resolved; without them (or for a peer's
        # forward) it is found here. An ensemble's step is its ensemble's caller's.
        if not admit:
            caller = step_of or ""
        elif not caller or caller == PEER:
            caller = tenants.caller(header)
        ensemble = self.ensemble(name, version) if self.ensembles else None
        if ensemble is not None:
            return await self._serve_ensemble(ensemble, decode, arrived, caller, admit)
        router = self.router
        origin, forwarded = "", False
        if router is not None and forward is not None:
            forwarded, origin = router.hop(header)
            reply = await via_peers(
                lambda: self.route(name, forwarded, origin),
                lambda peers: router.forward(forward, peers, origin, traceparent(), caller),
            )
            if reply is not None:
                return Forwarded(reply)
        # Its tenant's limits, before any work (a step: its ensemble's tenant, admitted).
        share = self._admit(caller, name, version) if admit else tenants.table.tenants.get(caller)
        try:
            decoded = decode()
            body: Decoded = await decoded if iscoroutine(decoded) else decoded  # type: ignore[assignment]
            weight = share.weight if share is not None else 1.0
            here = Here(name, version, arrived, caller, origin, forwarded, forward, traceparent,
                        weight)  # fmt: skip
            return await self._serve_here(here, body)
        except SequenceNotHere:
            if admit:  # a search's probe, not the tenant's request: its token back
                tenants.refund(caller)
            raise
        finally:
            if admit:
                tenants.release(caller)

    async def _serve_here(self, here: Here, body: Decoded) -> InferResult | Forwarded:
        """A request this site serves: the model fetched if the fleet's catalog has it
        and this site does not, validated, its sequence's turn taken (a stateful
        model), answered from the response cache or admitted through residency,
        queued and awaited, all before its deadline; its usage, statistics and
        demand counted however it ends."""
        loop, router = self.loop, self.router
        name, version, arrived, caller = here.name, here.version, here.arrived, here.caller
        record: ModelRecord | None = None
        ticket: Ticket | None = None
        live: Live | None = None  # a stateful model's sequence, its turn taken
        served = False
        request: Request | None = None
        failure = ""  # why it failed, for its tenant's usage record
        self._inflight += 1
        self._idle.clear()
        try:
            if self.draining:
                raise Unavailable("the agent is shutting down")
            if self.on_demand is not None and self.residency.get(name) is None and valid_name(name):
                # Within the request's time, which runs from its arrival (its model's
                # own limits are not known until it is here).
                wait_s = DEFAULT_TIMEOUT_S if body.timeout_s is None else body.timeout_s
                left_s = max(0.0, arrived + wait_s - loop.time())
                await self.on_demand(name, version, here.origin or self.region, left_s)
            record = self.entry(name, version)
            METRICS.of_model(name).requests.inc()
            # Its priority level (0: the model has one); none for a model whose config
            # could not be read, which fails below.
            config = record.source.config
            level = (
                config.priority_level(body.priority)
                if config is not None and config.priority_levels
                else 0
            )
            limit_s, delay_s = self._time_limit(record, body, level)
            deadline = arrived + limit_s
            if record.phase == Phase.FAILED:  # no interface to validate against
                raise ModelFailed.load(name, record.reason)
            inputs, wanted = body.inputs, body.outputs
            spec = record.source.sequence
            if spec is not None:  # a stateful model: the request's turn in its sequence
                config = record.config
                slots = spec.slots(record.max_batch_size, config.instance_count)
                try:
                    live = await self.sequences.enter(
                        name, record.version, spec, body.sequence, slots,
                        config.max_queue_size, deadline,
                    )  # fmt: skip
                except UnknownSequence as exc:
                    if here.forwarded:  # the forwarder tries the model's other holders
                        raise SequenceNotHere(exc.message) from None
                    elsewhere = await self._where_the_sequence_began(here)
                    if elsewhere is None:
                        raise
                    return elsewhere
                inputs = Sequences.inputs(live, inputs, record.max_batch_size > 0)
                wanted = Sequences.outputs(live, wanted)
            given, batch = validate(record, inputs, wanted)  # before any promotion
            if body.classify:
                kinds = {s.name: s.datatype for s in record.outputs}
                classification.check(body.classify, kinds, batch)
            cache = self.response_cache if record.config.response_cache else None
            if cache is not None:  # answered before admission: no promotion for a hit
                # The artifact's digest too: a replaced model.onnx answers anew.
                artifact = f"{record.version}:{record.source.digest}"
                lookup = await self._look_up(cache, name, artifact, given, wanted)
                if lookup.kept is not None:
                    self._answered_from_cache(lookup, self.queues.stats(record.key), arrived,
                                              caller, name, record.version)  # fmt: skip
                    served_by = router.site_id if router is not None else ""
                    kept = _classified(record, lookup.kept, body.classify)
                    return InferResult(record, kept, "", "", served_by)
            ticket = self.residency.admit(name, version, deadline)
            if not ticket.settled:
                waited = await ticket.wait(loop)
                METRICS.promotion_wait.observe(loop.time() - arrived)
                if not waited:
                    self.residency.abandon(ticket)
                    raise DeadlineExceeded(
                        f"model '{name}': request timed out waiting for the model to load"
                    )
            if ticket.error is not None:
                raise ticket.error
            request = Request(given, wanted, batch, deadline, loop.create_future())
            request.tenant, request.weight = caller, here.weight
            request.priority = level
            request.delay_at = arrived + delay_s  # inf: never (timeout_action: reject)
            request.cold_start = ticket.cold_start
            self.queues.submit(ticket.key, request)
            # A timer, not wait_for: one fewer task and loop hop on the hot path. The
            # batcher skips requests whose future is already done.
            timer = loop.call_at(deadline, _time_out, request.future, name)
            try:
                outputs = await request.future
            finally:
                timer.cancel()
            if request.form:
                METRICS.variant_requests.labels(model=name, variant=request.form).inc()
            if live is not None:
                outputs = Sequences.keep(live, outputs, body.outputs)
                served = True
            if cache is not None:
                self._keep(lookup, outputs, self.queues.stats(record.key))
            if body.classify:
                outputs = _classified(record, outputs, body.classify)
            served_by = router.site_id if router is not None else ""
            return InferResult(record, outputs, ticket.cold_start, request.form, served_by)
        except asyncio.CancelledError:  # the caller went away (Triton: CANCELED)
            failure = "CANCELED"
            if record is not None:
                self.queues.stats(record.key).record_failure(loop.time() - arrived, "CANCELED")
            raise
        except SequenceNotHere:
            raise  # a forwarder's search for the sequence, not the request's end
        except ServeError as exc:
            # Series exist only for models in the repository: an unknown name counts
            # under the empty label, so a client cannot mint series.
            failure = exc.failure_reason
            label = name if record is not None else ""
            if isinstance(exc, Overloaded):
                METRICS.refused.labels(model=label).inc()
            METRICS.failures.labels(model=label, code=exc.grpc_code.name).inc()
            if record is not None:
                self.queues.stats(record.key).record_failure(
                    loop.time() - arrived, exc.failure_reason
                )
            raise
        finally:
            if failure and self.usage is not None:
                count_failure(self.usage, caller, name, record, ticket, request, failure)
            if ticket is not None:
                self.residency.release(ticket)
            if live is not None:
                self.sequences.leave(live, served)
            elapsed = loop.time() - arrived
            if record is not None:
                METRICS.of_model(name).request_duration.observe(elapsed)
            if record is not None or valid_name(name):
                # Requests for a model this site lacks are demand the control plane
                # must see, or it would never place the model here.
                self.load_window.record(name, here.origin or self.region, elapsed)
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _where_the_sequence_began(self, here: Here) -> Forwarded | None:
        """A request in the middle of a sequence this site has no state for: begun at a
        peer, routed there before this site held the model, it goes on there, where
        its state is. None: it came from a peer, or no other site holds the model."""
        router, forward = self.router, here.forward
        if here.forwarded or forward is None or router is None:
            return None
        reply = await via_peers(
            lambda: router.holders(here.name),
            lambda peers: router.forward(
                forward, peers, here.origin, here.traceparent(), here.caller
            ),
        )
        return None if reply is None else Forwarded(reply)

    def _admit(self, caller: str, name: str, version: str) -> Tenant | None:
        """`caller` admitted for a request to `name` under its limits (its models, rate
        and concurrency), before any work; a refusal is counted in its usage."""
        try:
            return self.tenants.admit(caller, name)
        except ServeError as exc:
            if self.usage is not None:
                self.usage.record(caller, name, version, exc.failure_reason)
            raise

    async def _serve_ensemble(
        self,
        ensemble: Ensemble,
        decode: Callable[[], Decoded | Coroutine[Any, Any, Decoded]],
        arrived: float,
        caller: str,
        admit: bool,
    ) -> InferResult:
        """An ensemble request, in flight between its steps too (a drain waits for it).
        Its tenant is admitted once: an ensemble nested as a step is its outer
        ensemble's work (`admit` False), as a step's model is."""
        if admit:
            self._admit(caller, ensemble.name, ensemble.version)
        self._inflight += 1
        self._idle.clear()
        stats = self._ensemble_stats(ensemble)
        loop = self.loop
        try:
            return await self._run_ensemble(ensemble, decode, arrived, caller, stats)
        except ServeError as exc:
            stats.record_failure(loop.time() - arrived, exc.failure_reason)
            raise
        except asyncio.CancelledError:
            stats.record_failure(loop.time() - arrived, "CANCELED")
            raise
        finally:
            if admit:
                self.tenants.release(caller)
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _run_ensemble(
        self,
        ensemble: Ensemble,
        decode: Callable[[], Decoded | Coroutine[Any, Any, Decoded]],
        arrived: float,
        caller: str,
        stats: ModelStats,
    ) -> InferResult:
        """An ensemble request: each wave of steps runs together, each step a request
        to its model served here (its own residency and batching), all under the
        ensemble request's one deadline, used by its tenant `caller`; or, with the
        response cache, its kept answer, before any step runs."""
        name, loop = ensemble.name, self.loop
        if self.draining:
            raise Unavailable("the agent is shutting down")
        if not self._ensemble_ready(ensemble):
            raise Unavailable(
                f"Request for unknown model: '{name}' has no available versions "
                "(an ensemble step's model is not available)"
            )
        decoded = decode()
        body: Decoded = await decoded if iscoroutine(decoded) else decoded  # type: ignore[assignment]
        tensors = ensemble_inputs(ensemble, body.inputs)
        if body.classify:
            kinds = {t.name: t.datatype for t in ensemble.outputs}
            classification.check(body.classify, kinds, _rows(ensemble, tensors))
        cache = self.response_cache if ensemble.response_cache else None
        if cache is not None:
            artifacts = self._ensemble_artifacts(ensemble)
            lookup = await self._look_up(cache, name, artifacts, tensors, body.outputs)
            if lookup.kept is not None:
                self._answered_from_cache(lookup, stats, arrived, caller, name, ensemble.version)
                return InferResult(ensemble, _classified(ensemble, lookup.kept, body.classify), "")
        for wave in ensemble.waves:
            results = await asyncio.gather(
                *(self._ensemble_step(step, tensors, body, arrived, caller) for step in wave)
            )
            for step, outputs in zip(wave, results, strict=True):
                for output, tensor in step.outputs.items():
                    tensors[tensor] = outputs[output]
        wanted = body.outputs or [t.name for t in ensemble.outputs]
        unknown = [o for o in wanted if o not in {t.name for t in ensemble.outputs}]
        if unknown:
            raise InvalidInput(f"unexpected inference output '{unknown[0]}' for model '{name}'")
        outputs = {o: tensors[o] for o in wanted}
        if cache is not None:
            self._keep(lookup, outputs, stats)
        stats.record_request(loop.time() - arrived, _rows(ensemble, outputs))
        return InferResult(ensemble, _classified(ensemble, outputs, body.classify), "")

    # --- the response cache, for models and ensembles alike ----------------------------------

    async def _look_up(
        self,
        cache: ResponseCache,
        name: str,
        artifact: str,
        inputs: dict[str, np.ndarray],
        wanted: list[str] | None,
    ) -> Lookup:
        """The request's key and its kept answer, if any. BLAKE2b lets go of the GIL: a
        large input is digested on a worker thread, and the loop serves on meanwhile."""
        started = self.loop.time()
        if sum(array.nbytes for array in inputs.values()) > OFFLOAD_BYTES:
            key = await asyncio.to_thread(cache.key, name, artifact, inputs, wanted)
        else:
            key = cache.key(name, artifact, inputs, wanted)
        return Lookup(cache, key, inputs, cache.get(key), self.loop.time() - started)

    def _answered_from_cache(self, lookup: Lookup, stats: ModelStats, arrived: float,
                             caller: str, name: str, version: str) -> None:  # fmt: skip
        """A hit: a success in the statistics, and a request with no compute in usage."""
        assert lookup.kept is not None
        stats.record_cache_hit(self.loop.time() - arrived, lookup.seconds)
        if self.usage is not None:
            self.usage.record(caller, name, version, "", nbytes(lookup.inputs),
                              nbytes(lookup.kept))  # fmt: skip

    def _keep(self, lookup: Lookup, outputs: dict[str, np.ndarray], stats: ModelStats) -> None:
        """A miss, answered: its answer kept. The lookup and the keeping are the
        miss's time."""
        started = self.loop.time()
        lookup.cache.put(lookup.key, outputs)
        stats.cache_miss.add(lookup.seconds + self.loop.time() - started)

    def _ensemble_artifacts(self, ensemble: Ensemble, depth: int = 0) -> str:
        """What an ensemble's answer depends on: its version and each step model's
        version and artifact (a nested ensemble's, in turn), for its cache key."""
        parts = [ensemble.version]
        for model in ensemble.models:
            nested = self.ensembles.get(model)
            if nested is not None and depth < MAX_ENSEMBLE_DEPTH:
                parts.append(f"{model}({self._ensemble_artifacts(nested, depth + 1)})")
            elif (record := self.residency.get(model)) is not None:
                parts.append(f"{model}:{record.version}:{record.source.digest}")
        return ",".join(parts)

    async def _ensemble_step(
        self,
        step: Step,
        tensors: dict[str, np.ndarray],
        request: Decoded,
        arrived: float,
        caller: str,
    ) -> dict[str, np.ndarray]:
        inputs = [
            InferInput(given, oip_datatype(tensors[tensor]), list(tensors[tensor].shape),
                       tensors[tensor])
            for given, tensor in step.inputs.items()
        ]  # fmt: skip
        # As in Triton, the request's deadline, its sequence (id, START, END) and its
        # priority go to every step: a stateful step model carries its state under that
        # sequence.
        body = StepBody(
            inputs, list(step.outputs) or None, request.timeout_s, request.sequence,
            request.priority, deadline_s=request.deadline_s,
        )  # fmt: skip
        result = await self.handle(step.model, step.version, _no_header, None, lambda: body,
                                   arrived=arrived, step_of=caller)  # fmt: skip
        return result.outputs  # type: ignore[union-attr]  # served here: never Forwarded

    @staticmethod
    def _time_limit(record: ModelRecord, body: Decoded, level: int = 0) -> tuple[float, float]:
        """Seconds the request may take, and after how many, still queued, it is
        delayed behind its level's requests (inf: never). The caller's time (its
        `timeout` parameter only where the model allows the override) always ends it;
        the model's (its priority `level`'s, where the level has one of its own) ends
        it too, or, under `timeout_action: delay`, delays it, and the agent's default
        time ends it after that where the caller gave none."""
        config = record.source.config
        if config is None:
            model_s, delay, override = DEFAULT_TIMEOUT_S, False, True
        elif level and config.priority_queue_policy:  # a level with its own, maybe
            timeout_ms, delay, override = config.queue_policy(level)
            model_s = timeout_ms / 1000
        else:  # the model's own, as queue_policy gives them: read here, no call a request
            model_s = config.timeout_ms / 1000
            delay, override = config.timeout_action == "delay", config.allow_timeout_override
        caller_s = body.timeout_s if override else body.deadline_s
        if caller_s is not None and caller_s <= 0:
            raise DeadlineExceeded(f"model '{record.name}': request arrived past its deadline")
        if not delay:
            return (model_s if caller_s is None else min(model_s, caller_s)), math.inf
        limit = model_s + DEFAULT_TIMEOUT_S if caller_s is None else caller_s
        return limit, (model_s if model_s < limit else math.inf)

    def tier_of(self, name: str) -> str:
        """The tier `name` is in now ("" for a model this site does not know)."""
        record = self.residency.get(name)
        return str(record.tier) if record is not None else ""

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._inflight

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for in-flight ones; True if all finished."""
        self.draining = True
        self.sequences.close("the agent is shutting down")  # no START waits out the drain
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False


MAX_ENSEMBLE_DEPTH = 4  # ensembles of ensembles, at most this deep


@dataclass(slots=True)
class Here:
    """A request on its way to being served at this site, once routed and admitted
    under its tenant."""

    name: str
    version: str
    arrived: float  # loop.time() when the door had its headers: its deadline's start
    caller: str  # its tenant
    origin: str  # the region it came from ("": this one)
    forwarded: bool  # sent here by a peer
    forward: HttpForward | GrpcForward | None  # as received, to pass on undecoded
    traceparent: Callable[[], str]
    weight: float  # its tenant's share of a queue


@dataclass(frozen=True)
class Lookup:
    """A request looked up in the response cache: its key, its inputs, its kept
    answer (None: a miss) and how long the lookup took."""

    cache: ResponseCache
    key: bytes
    inputs: dict[str, np.ndarray]
    kept: dict[str, np.ndarray] | None
    seconds: float


@dataclass(frozen=True)
class StepBody:
    """An ensemble step's request, decoded already."""

    inputs: list[InferInput]
    outputs: list[str] | None
    timeout_s: float | None
    sequence: Flags | None = None
    priority: int = 0
    classify: dict[str, int] = field(default_factory=dict)
    deadline_s: float | None = None


def _classified(
    entry: ModelRecord | Ensemble, outputs: dict[str, np.ndarray], wanted: dict[str, int]
) -> dict[str, np.ndarray]:
    """`outputs` with those asked for as classifications replaced by their top classes
    (oip/classification.py), labelled as the config's label files say."""
    if not wanted:
        return outputs
    declared = entry.source.declared_outputs if isinstance(entry, ModelRecord) else entry.outputs
    labels = {t.name: t.labels for t in declared if t.labels}
    return classification.classify(outputs, wanted, labels, entry.max_batch_size > 0)


def _where(record: ModelRecord) -> str:
    """Where a ready version is, for the repository index's reason ("": on the
    device)."""
    if record.phase in (Phase.READY, Phase.DRAINING):
        return ""
    if record.phase == Phase.ABSENT:
        return f"not on the device ({record.tier}): loaded on its next request"
    return f"{record.phase}: a request waits for it"


def _no_header(name: str) -> str | None:
    return None


def ensemble_inputs(ensemble: Ensemble, given: list[InferInput]) -> dict[str, np.ndarray]:
    """The request's inputs by name, checked against what the ensemble declares
    (names and datatypes; the shapes are checked by the steps' models)."""
    declared = {t.name: t for t in ensemble.inputs}
    tensors = {}
    for tensor in given:
        spec = declared.get(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"unexpected inference input '{tensor.name}' for model '{ensemble.name}'"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                f"'{ensemble.name}' expects '{spec.datatype}'"
            )
        tensors[tensor.name] = tensor.array
    missing = sorted(set(declared) - set(tensors))
    if missing:
        raise InvalidInput(
            f"expected {len(declared)} inputs but got {len(tensors)} inputs for model "
            f"'{ensemble.name}'. Got input(s) {sorted(tensors)}, but missing required input(s) "
            f"{missing}"
        )
    return tensors


def _time_out(future: asyncio.Future[dict[str, np.ndarray]], model: str) -> None:
    if not future.done():
        future.set_exception(DeadlineExceeded(f"model '{model}': request timed out"))


def _rows(ensemble: Ensemble, outputs: dict[str, np.ndarray]) -> int:
    """An ensemble request's inference count: its batch's rows (those of `outputs`, or
    of its inputs), or 1 unbatched."""
    if ensemble.max_batch_size <= 0 or not outputs:
        return 1
    first = next(iter(outputs.values()))
    return int(first.shape[0]) if first.ndim else 1
