"""Host memory limits for dedicated runners: cgroup v2, else cgroup v1, else RLIMIT_AS.

The agent detects once, at start, which mechanism this host offers and logs it
(also in GET /edgeplex/v1/memory). A model with `memory_limit` and
`isolation: dedicated` gets its runner limited:

- cgroup v2: a child group with `memory.max` under the agent's own group (needs
  the memory controller enabled there and write access);
- cgroup v1: a group under the memory hierarchy with `memory.limit_in_bytes`
  (and swap forbidden where the kernel accounts it);
- RLIMIT_AS, set in the runner itself right after the fork: a cap on address
  space, coarser (thread stacks and arenas reserve more than they use), so it is
  applied with 512 MiB of headroom.

A runner over its limit is killed by the kernel (cgroups) or fails its
allocation (rlimit); the supervisor handles it like any other crash, and a model
whose load crashes its runner twice is FAILED. Called on the agent's event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("edgeplex.agent.runners.limits")

CGROUP_ROOT = Path("/sys/fs/cgroup")
RLIMIT_HEADROOM = 512 * 1024 * 1024


class MemoryLimiter:
    def __init__(self) -> None:
        self.mechanism, self._base = self._detect()
        self._groups: dict[str, Path] = {}

    @staticmethod
    def _detect() -> tuple[str, Path | None]:
        name = f"edgeplex-{os.getpid()}"
        v2 = CGROUP_ROOT / "cgroup.controllers"
        if v2.is_file() and "memory" in v2.read_text().split():
            own = CGROUP_ROOT / _own_v2_group().lstrip("/")
            base = own / name
            with contextlib.suppress(OSError):
                base.mkdir(exist_ok=True)
                (base / "cgroup.subtree_control").write_text("+memory")
                return "cgroup2", base
        v1 = CGROUP_ROOT / "memory"
        if (v1 / "memory.limit_in_bytes").is_file() and os.access(v1, os.W_OK):
            base = v1 / name
            with contextlib.suppress(OSError):
                base.mkdir(exist_ok=True)
                return "cgroup1", base
        return "rlimit", None

    def rlimit_for(self, limit: int) -> int:
        """What the runner should set as RLIMIT_AS itself (0 = nothing to set)."""
        return limit + RLIMIT_HEADROOM if self.mechanism == "rlimit" and limit else 0

    def apply(self, runner_id: str, pid: int, limit: int) -> None:
        if not limit or self._base is None:
            return
        group = self._base / runner_id
        try:
            group.mkdir(exist_ok=True)
            if self.mechanism == "cgroup2":
                (group / "memory.max").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("0")
            else:
                (group / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
            (group / "cgroup.procs").write_text(str(pid))
            self._groups[runner_id] = group
        except OSError as exc:
            log.error("could not limit runner %s to %d bytes: %s", runner_id, limit, exc)

    def release(self, runner_id: str) -> None:
        group = self._groups.pop(runner_id, None)
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()

    def close(self) -> None:
        for runner_id in list(self._groups):
            self.release(runner_id)
        if self._base is not None:
            with contextlib.suppress(OSError):
                self._base.rmdir()


def _own_v2_group() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return "/"
