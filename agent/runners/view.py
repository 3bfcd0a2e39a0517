"""What the agent puts in each runner's sandbox, from its settings: the paths a
runner sees (read-only or writable), the secrets masked should one lie under
them, the device nodes, and the shared runner's memory limit. Pure: the zygote's
child applies it (sandbox.py)."""

from __future__ import annotations

import contextlib
import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgeplex.settings import state_dir

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.config import AgentSettings


@dataclass(frozen=True)
class RunnerView:
    read_only: list[str] = field(default_factory=list)
    writable: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)


def runner_view(settings: AgentSettings, staging: Path) -> RunnerView:
    """The model repository and artifact cache read-only; the staged tier and the
    variant store writable (runners write staged copies and build variants); the
    agent's state directory, tokens, pinned key and TLS keys masked."""
    repo = settings.model_repo.absolute()
    artifacts = settings.fleet.artifact_dir or repo / ".artifacts"
    variants = settings.variant_dir or repo / ".variants"
    if variants.parent.is_dir():  # bound before the first build makes it
        variants.mkdir(exist_ok=True)
    read_only = [str(repo), str(artifacts), *map(str, settings.fleet.artifact_file_roots)]
    read_only += map(str, settings.runner.sandbox_paths)
    read_only += repository_links(repo)
    devices: list[str] = []
    if settings.runner.execution_provider == "cuda":
        devices = sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*"))
        read_only.append("/sys")  # NVML reads the PCI topology
    security, fleet = settings.security, settings.fleet
    secrets = [
        state_dir(),
        security.admin_token_file,
        security.tls_key,
        fleet.trust_file,
        fleet.tls_key,
    ]
    hidden = [str(Path(p).absolute()) for p in secrets if p is not None]
    return RunnerView(
        read_only=[str(Path(p).absolute()) for p in read_only],
        writable=[str(staging.absolute()), str(variants.absolute())],
        devices=devices,
        hidden=hidden,
    )


def repository_links(repo: Path, depth: int = 3) -> list[str]:
    """Where the symbolic links in the repository lead (a model folder, a version
    folder or a model file linked from elsewhere, as operators arrange them): those
    targets are in the view too, as they are at the runner's start."""
    targets: list[str] = []

    def walk(directory: Path, level: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries[:10_000]:
            path = Path(entry.path)
            if entry.is_symlink():
                with contextlib.suppress(OSError):
                    targets.append(str(path.resolve(strict=True)))
            elif level < depth and entry.is_dir(follow_symlinks=False):
                walk(path, level + 1)

    walk(repo, 1)
    return targets


def shared_runner_limit(settings: AgentSettings) -> int:
    """The shared runner's host memory limit in bytes (0: none): runner.memory_limit,
    else the budgets its models may fill plus the headroom."""
    runner = settings.runner
    if runner.memory_limit:
        return runner.memory_limit
    budgets = [settings.host_memory_budget]
    if runner.execution_provider == "cpu":  # loaded models live in host memory too
        budgets.append(settings.device_memory_budget)
    if all(b is None for b in budgets):
        return 0
    return sum(b or 0 for b in budgets) + runner.memory_headroom
