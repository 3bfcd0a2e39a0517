"""Reconcile the model table with the desired state the control plane published.

`Reconciler.offer()` is called for every DesiredState message; versions not
above the last applied one are ignored (a retained message seen again after a
reconnect, or a stale one from a deposed leader). `run()` is the one task that
applies them, newest first: a message that arrives during a reconcile replaces
any pending one, so the agent never works through a backlog.

Applying is idempotent:
1. fetch each model's artifact into the content-addressed cache (sha256
   checked before use) and install it in the repository as
   `<repo>/<name>/<version>/model.onnx` (a symlink into the cache), atomically,
   with the config.pbtxt and its files that an archive brings beside it
   (model_folder.py);
2. load the `loaded` models (pinned ones pinned), stage the `staged` ones; a
   model this site then loads because a request asked for it takes no room
   from the `loaded` ones (agent/residency/planner.py);
3. demote to `staged` every other loaded model that is not pinned locally (one
   that live sequences hold, once they end: Residency.demote).

A model whose artifact cannot be fetched or verified, whatever the cause, is
reported FAILED with the reason (`failures`), nothing else is disturbed, and
the desired state is applied again after a backoff (jittered, up to 5 s doubling to 5 min)
until it succeeds or a newer one arrives. A version counts as applied once
every model in it is in its desired state or failed with a reason. After each
pass the artifact cache is pruned to `disk_cache_budget`, least recently used
first, never what the desired state names. The agent keeps serving the last
state it applied while the control plane or broker is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from edgeplex.agent.catalog.triton_config import MODEL_FILE
from edgeplex.agent.fleet import model_folder
from edgeplex.agent.residency.state import Phase, Tier
from edgeplex.artifacts import ArtifactCache, ArtifactError, log_progress, model_file
from edgeplex.durable import crash_point, write_atomic
from edgeplex.fleet import Backoff
from edgeplex.names import path_under, valid_name, valid_version
from edgeplex.proto import edgeplex_control_pb2 as pb

if TYPE_CHECKING:  # the core imports the fleet package
    from edgeplex.agent.core import Agent

log = logging.getLogger("edgeplex.agent.reconcile")

RETRY_INITIAL_S = 5.0
RETRY_MAX_S = 300.0


def _remove_flat(directory: Path) -> None:
    """Remove an install's directory (its files are links and markers, no subfolders)."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.is_dir():
        for p in directory.iterdir():
            p.unlink()
        directory.rmdir()


class Reconciler:
    def __init__(
        self,
        agent: Agent,
        repo: Path,
        artifacts: ArtifactCache,
        disk_budget: int | None = None,
    ) -> None:
        self._agent = agent
        self._repo = repo
        self._artifacts = artifacts
        self._disk_budget = disk_budget
        self._retry = Backoff(RETRY_INITIAL_S, RETRY_MAX_S, floor_s=1.0)
        self._installing = threading.Lock()  # reconcile and on-demand fetches both install
        self._pending: pb.DesiredState | None = None
        self._wake = asyncio.Event()
        self.applied_version = 0
        self.failures: dict[str, str] = {}  # model -> why its artifact is unusable
        self.managed: set[str] = set()  # models the control plane told us about
        self.applied = asyncio.Event()  # set after each reconcile (tests wait on it)

    def offer(self, desired: pb.DesiredState) -> bool:
        """Queue `desired` unless it is stale. True when queued."""
        newest = max(self.applied_version, self._pending.version if self._pending else 0)
        if desired.version <= newest:
            return False
        self._pending = desired
        self._wake.set()
        return True

    async def run(self) -> None:
        retry: pb.DesiredState | None = None
        delay = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            desired, self._pending = self._pending, None
            desired = desired or retry  # a newer state replaces the one being retried
            if desired is None:
                delay = None
                continue
            try:
                await self.apply(desired)
                complete = not any(dm.name in self.failures for dm in desired.models)
                self.applied_version = max(self.applied_version, desired.version)
            except Exception:
                log.exception("reconcile of desired state v%d failed", desired.version)
                complete = False
            self.applied.set()
            if complete:
                retry, delay = None, None
                self._retry.reset()
            else:
                retry, delay = desired, self._retry.delay()
                log.info("desired state v%d: retrying in %.0f s", desired.version, delay)

    async def apply(self, desired: pb.DesiredState) -> None:
        log.info("applying desired state v%d: %d models", desired.version, len(desired.models))
        installed: list[pb.DesiredModel] = []
        for dm in desired.models:
            if not valid_name(dm.name) or not valid_version(dm.version or "1"):
                self.failures[dm.name[:128]] = "invalid model name or version in desired state"
                continue
            try:
                await asyncio.to_thread(self.install, dm)
            except Exception as exc:  # whatever the cause, this model failed, with a reason
                known = isinstance(exc, ArtifactError | ValueError)
                reason = str(exc) if known else type(exc).__name__
                self.failures[dm.name] = reason
                log.warning("model %s: %s", dm.name, reason)
                continue
            self.failures.pop(dm.name, None)
            self.managed.add(dm.name)
            installed.append(dm)
        agent = self._agent
        residency = agent.residency
        agent.discover()
        wanted_loaded = {dm.name for dm in installed if dm.tier == "loaded"}
        wanted_staged = {dm.name for dm in installed if dm.tier == "staged"}
        residency.set_placed(wanted_loaded)
        # Make room first: demote what is no longer wanted here (after its admitted
        # requests are answered; a stateful model, after its live sequences too, for a
        # while: they go on where their state is).
        for entry in residency.records():
            if entry.name in wanted_loaded or entry.phase != Phase.READY:
                continue
            if entry.name in self.managed and entry.pinned:
                residency.pin(entry.name, False)  # the control plane no longer pins it here
            if not entry.pinned:
                with contextlib.suppress(Exception):
                    await agent.demote(entry.name, str(Tier.STAGED), after_sequences=True)
        for dm in sorted(installed, key=lambda d: (not d.pin, -d.priority, d.name)):
            if dm.name in wanted_loaded:
                if dm.pin:
                    residency.pin(dm.name, True)
                try:
                    await agent.place(dm.name)
                except Exception as exc:
                    log.warning("model %s: load for placement failed: %s", dm.name, exc)
        for name in sorted(wanted_staged):
            residency.stage(name)
        keep = {dm.sha256 for dm in desired.models}
        dropped = await asyncio.to_thread(self._artifacts.prune, self._disk_budget, keep)
        if dropped:
            log.info("artifact cache over its budget: dropped %d artifacts", len(dropped))

    def _write_config(self, dm: pb.DesiredModel) -> None:
        """The catalog's serving options the agent reads from `config.yaml`: variants
        and quality (nothing is written for a model that declares neither)."""
        config = self._repo / dm.name / "config.yaml"
        if not dm.variants and not dm.quality:
            return
        text = yaml.safe_dump({"variants": list(dm.variants), "quality": dm.quality or "exact"})
        if config.is_file() and config.read_text() == text:
            return
        write_atomic(config, text.encode(), 0o644)

    def install(self, dm: pb.DesiredModel) -> None:
        """Make `<repo>/<name>/<version>/model.onnx` the verified artifact. Blocking.
        ValueError for a name or version that is not one (whoever sent it)."""
        version = dm.version or "1"
        if not valid_version(version):
            raise ValueError(f"invalid version {version[:32]!r} of model {dm.name[:64]!r}")
        path_under(self._repo, dm.name, version)  # ValueError unless a valid name
        with self._installing:
            self._install(dm)
            self._write_config(dm)

    def _install(self, dm: pb.DesiredModel) -> None:
        version = dm.version or "1"
        target = path_under(self._repo, dm.name, version)
        marker = target / ".sha256"
        if marker.is_file() and marker.read_text().strip() == dm.sha256:
            return
        artifact = self._artifacts.fetch(
            dm.artifact_uri, dm.sha256, progress=log_progress(log, f"model {dm.name}")
        )
        onnx = model_file(artifact)
        # A Triton model folder's config.pbtxt and its files, before the version: a
        # kill between the two installs both again (the version's marker is last).
        model_folder.place(artifact, self._repo / dm.name)
        beside = model_folder.model_level(artifact)
        staging = path_under(self._repo, dm.name, f".{version}.tmp")
        old = path_under(self._repo, dm.name, f".{version}.old")
        _remove_flat(staging)
        _remove_flat(old)  # a replacement killed between its two renames left it
        staging.mkdir()
        os.symlink(onnx, staging / MODEL_FILE)
        if artifact.is_dir():
            for extra in artifact.iterdir():  # external weights next to the graph
                if extra.name != MODEL_FILE and extra.is_file() and extra.name not in beside:
                    os.symlink(extra, staging / extra.name)
        write_atomic(staging / ".sha256", (dm.sha256 + "\n").encode(), 0o644)
        if target.exists():
            os.replace(target, old)
            crash_point("install:moved-old")
            os.replace(staging, target)
            _remove_flat(old)
        else:
            os.replace(staging, target)

    def recover(self) -> int:
        """Finish or undo installs a kill interrupted (at start, before any install):
        a version moved aside (`.V.old`) whose replacement never arrived comes back, a
        complete replacement (`.V.tmp` with its marker) goes in, the rest is removed.
        Returns how many versions were restored or completed."""
        fixed = 0
        with contextlib.suppress(OSError):
            for model in self._repo.iterdir():
                if not valid_name(model.name) or not model.is_dir():
                    continue
                for leftover in sorted(model.glob(".*.old")) + sorted(model.glob(".*.tmp")):
                    version = leftover.name[1:].rsplit(".", 1)[0]
                    target = model / version
                    done = leftover.suffix == ".old" or (leftover / ".sha256").is_file()
                    if valid_version(version) and not target.exists() and done:
                        os.replace(leftover, target)
                        fixed += 1
                        log.warning("model %s: version %s recovered", model.name, version)
                    else:
                        _remove_flat(leftover)
        return fixed
