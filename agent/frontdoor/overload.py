"""Overload shedding: whether the agent should refuse new work right now.

A task on the agent's loop wakes every TICK_S and measures how late it woke
(the loop's lag: every callback queued ahead of it) and, every few ticks, the
memory left to the agent (its cgroup's limit and usage, v2 then v1, else the
host's MemAvailable). `reason()` is what the gate asks before it admits a
request: "loop_lag", "memory" or None. Health, status and /metrics never ask,
so they stay answerable while inference is shed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from edgeplex.agent.observability.metrics import METRICS

TICK_S = 0.05
MEMORY_EVERY = 10  # ticks


def memory_available_fraction() -> float | None:
    """Memory left to this process's cgroup (or host) as a fraction of its total."""
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (v1 + "limit_in_bytes", v1 + "usage_in_bytes"),
    ):
        with contextlib.suppress(OSError, ValueError):
            raw = Path(limit_file).read_text().strip()
            if raw != "max" and int(raw) < 1 << 60:
                limit = int(raw)
                return max(0.0, 1 - int(Path(usage_file).read_text()) / limit)
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0])
    if fields.get("MemTotal") and "MemAvailable" in fields:
        return fields["MemAvailable"] / fields["MemTotal"]
    return None


class OverloadWatch:
    """Owned by the agent's loop; `run` is its task, `reason` is read by the gate."""

    def __init__(self, max_lag_s: float, min_memory_available: float) -> None:
        self.max_lag_s = max_lag_s
        self.min_memory_available = min_memory_available
        self.lag_s = 0.0
        self.memory_short = False

    def reason(self) -> str | None:
        if self.lag_s > self.max_lag_s:
            return "loop_lag"
        if self.memory_short:
            return "memory"
        return None

    async def run(self) -> None:
        ticks = 0
        while True:
            start = time.monotonic()
            await asyncio.sleep(TICK_S)
            self.lag_s = max(0.0, time.monotonic() - start - TICK_S)
            METRICS.loop_lag.set(self.lag_s)
            ticks += 1
            if self.min_memory_available > 0 and ticks % MEMORY_EVERY == 0:
                left = memory_available_fraction()
                self.memory_short = left is not None and left < self.min_memory_available
