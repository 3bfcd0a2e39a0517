"""Host memory limits of runners: cgroup v2, else cgroup v1, else RLIMIT_AS.

The agent detects once, at start, which mechanism this host offers and logs it
(also in GET /edgeplex/v1/memory). Every runner gets a group of its own, which the
zygote puts it in before it runs: the shared runner limited to runner.memory_limit
(or its models' budgets plus headroom), a dedicated runner to its model's
`memory_limit`:

- cgroup v2: a child group with `memory.max` under the agent's own group (needs
  the memory controller enabled there and write access);
- cgroup v1: a group under the memory hierarchy with `memory.limit_in_bytes`
  (and swap forbidden where the kernel accounts it);
- RLIMIT_AS, set in the runner itself right after the fork: a cap on address
  space, coarser (thread stacks and arenas reserve more than they use), so it is
  applied with 512 MiB of headroom.

A runner over its limit is killed by the kernel (cgroups) or fails its
allocation (rlimit); the supervisor handles it like any other crash, naming the
limit (`oom_killed`), and a model whose load crashes its runner twice is FAILED.
Called on the agent's event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from edgeplex.durable import alive

log = logging.getLogger("edgeplex.agent.runners.limits")

CGROUP_ROOT = Path("/sys/fs/cgroup")
RLIMIT_HEADROOM = 512 * 1024 * 1024


class MemoryLimiter:
    def __init__(self) -> None:
        self.mechanism, self._base = self._detect()
        self._groups: dict[str, Path] = {}
        self._kills: dict[str, int] = {}  # OOM kills of each group already reported

    @staticmethod
    def _detect() -> tuple[str, Path | None]:
        name = f"edgeplex-{os.getpid()}"
        v2 = CGROUP_ROOT / "cgroup.controllers"
        if v2.is_file() and "memory" in v2.read_text().split():
            base = _delegated_v2_base(CGROUP_ROOT / _own_v2_group().lstrip("/"), name)
            if base is not None:
                return "cgroup2", base
        v1 = CGROUP_ROOT / "memory"
        if (v1 / "memory.limit_in_bytes").is_file() and os.access(v1, os.W_OK):
            sweep_dead_groups(v1)
            base = v1 / name
            with contextlib.suppress(OSError):
                base.mkdir(exist_ok=True)
                return "cgroup1", base
        return "rlimit", None

    def rlimit_for(self, limit: int) -> int:
        """What the runner should set as RLIMIT_AS itself (0 = nothing to set)."""
        return limit + RLIMIT_HEADROOM if self.mechanism == "rlimit" and limit else 0

    def group(self, runner_id: str, limit: int) -> list[str]:
        """Make (or update) `runner_id`'s group, limited to `limit` bytes (0: none);
        returns the cgroup.procs files its next process must join before it runs
        (none where this host has no cgroup to give it)."""
        if self._base is None:
            return []
        group = self._base / runner_id
        try:
            group.mkdir(exist_ok=True)
            if self.mechanism == "cgroup2":
                (group / "memory.max").write_text(str(limit) if limit else "max")
                if limit:
                    with contextlib.suppress(OSError):
                        (group / "memory.swap.max").write_text("0")
            else:
                value = str(limit) if limit else "-1"
                with contextlib.suppress(OSError):  # memsw may not be below the limit
                    (group / "memory.memsw.limit_in_bytes").write_text("-1")
                (group / "memory.limit_in_bytes").write_text(value)
                if limit:
                    with contextlib.suppress(OSError):
                        (group / "memory.memsw.limit_in_bytes").write_text(value)
        except OSError as exc:
            log.error("could not limit runner %s to %d bytes: %s", runner_id, limit, exc)
            return []
        self._groups[runner_id] = group
        self._kills.setdefault(runner_id, self._oom_kills(group))
        return [str(group / "cgroup.procs")]

    def oom_killed(self, runner_id: str) -> bool:
        """Whether the kernel killed a process of this runner's group for exceeding its
        limit since the last time this was asked."""
        group = self._groups.get(runner_id)
        if group is None:
            return False
        kills = self._oom_kills(group)
        seen, self._kills[runner_id] = self._kills.get(runner_id, 0), kills
        return kills > seen

    def _oom_kills(self, group: Path) -> int:
        name = "memory.events" if self.mechanism == "cgroup2" else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def release(self, runner_id: str) -> None:
        group = self._groups.pop(runner_id, None)
        self._kills.pop(runner_id, None)
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()

    def close(self) -> None:
        for runner_id in list(self._groups):
            self.release(runner_id)
        if self._base is not None:
            with contextlib.suppress(OSError):
                self._base.rmdir()


def _delegated_v2_base(own: Path, name: str) -> Path | None:
    """A group for runners under this process's own (delegated) group: cgroup v2 lets
    a group with processes in it enable no controller for its children, so the agent
    first moves itself into a leaf `agent` beside them (systemd's Delegate=yes makes
    the unit's group ours to divide). None where any step is refused."""
    try:
        procs = (own / "cgroup.procs").read_text().split()
        if procs and (own / "cgroup.subtree_control").read_text().split().count("memory") == 0:
            leaf = own / "agent"
            leaf.mkdir(exist_ok=True)
            for pid in procs:  # the agent (its zygote is started later, into the leaf)
                with contextlib.suppress(OSError):
                    (leaf / "cgroup.procs").write_text(pid)
            (own / "cgroup.subtree_control").write_text("+memory")
        base = own / name
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+memory")
        return base
    except OSError as exc:
        log.info("no cgroup v2 memory controller to delegate here: %s", exc)
        return None


def sweep_dead_groups(hierarchy: Path) -> None:
    """Remove the groups of agents that died (named edgeplex-<pid>, empty of processes
    once their runners are gone too)."""
    for base in hierarchy.glob("edgeplex-*"):
        pid = base.name.removeprefix("edgeplex-")
        if not pid.isdigit() or alive(int(pid)):
            continue
        for group in [g for g in base.iterdir() if g.is_dir()] + [base]:
            with contextlib.suppress(OSError):
                group.rmdir()


def _own_v2_group() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return "/"
