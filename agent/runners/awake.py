"""Waiting awake for a quick reply from a runner.

When the agent's event loop has nothing to do it sleeps in epoll, and a
runner's reply then has to wake it: on a virtual machine that wake-up costs
tens of microseconds, as much as a small model's whole run. While the only
batch in flight is one whose model has been answering within the budget,
the loop keeps polling instead (a callback that re-queues itself, so epoll is
asked with a zero timeout) until the reply is in or the budget is spent.

Under load none of this happens: several batches are in flight, or the loop
is busy anyway. A slow model (its last round trip over the budget) never
makes the loop spin.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


class AwakeWaits:
    def __init__(self, budget_us: int) -> None:
        self.budget_s = budget_us / 1e6
        self.in_flight = 0  # batches sent to any runner and not yet answered

    def sent(self, reply: asyncio.Future[Any], recent_round_trip_s: float) -> None:
        """A batch left; `reply` is its answer. Call `answered` when it is in."""
        self.in_flight += 1
        if self.in_flight == 1 and recent_round_trip_s < self.budget_s:
            until = time.perf_counter() + self.budget_s
            loop = reply.get_loop()

            def poll() -> None:
                if not reply.done() and time.perf_counter() < until:
                    loop.call_soon(poll)

            loop.call_soon(poll)

    def answered(self) -> None:
        self.in_flight -= 1
