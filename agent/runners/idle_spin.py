"""Waiting awake for a runner's next batch.

A runner with nothing to do blocks in recv(), and the agent's next frame has
to wake it: on a virtual machine that wake-up can cost more than a small
model's whole run (about 0.15 ms of the 0.4 ms the agent added at one request
in flight, measured with wrk against `mlp_small`). After a batch that the
agent sent alone (no other batch in flight: light load), while frames have
been arriving within the budget of the runner going idle, its reader polls
the socket instead, for at most the budget, then blocks as before. Under load
the agent has several batches in flight and the runner never polls: on a
saturated machine a poll would take CPU from the agent and its clients
(measured: 5-10% of the throughput of a 2-vCPU machine at its ceiling).

Each poll that finds the frame banks a credit (up to 16), each empty one
costs four: a steady stream keeps polling through an occasional stall, and
once the credit is gone every empty poll doubles the number of waits that
block without polling (2, 4, ... 256). A runner whose traffic is sparse, or
whose client is slower than the budget, so polls for one budget in hundreds
of waits. Nothing polls while the runner has work of its own (a batch on a
worker thread, a load, background staging): the CPU is theirs.

The poll releases the GIL at every recv(), so the runner's other threads
are not held up by it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

MAX_CREDIT = 16  # polls that found the frame, banked against occasional misses
MISS_COST = 4  # credit one empty poll takes
MAX_BACKOFF_EXPONENT = 8  # at most 2**8 waits without a poll once the credit is gone


class IdleSpin:
    def __init__(self, budget_us: int, quiet: Callable[[], bool]) -> None:
        self.budget_s = budget_us / 1e6
        self._quiet = quiet  # whether the runner has nothing else to do
        self.invited = False  # the last batch came alone: the agent is lightly loaded
        self._credit = 0  # from polls that found the next frame
        self._skip = 0  # waits left that block without polling
        self._misses = 0  # empty polls in a row since the credit ran out

    def recv_into(self, sock: socket.socket, view: memoryview) -> int | None:
        """Bytes received by polling (0: the peer closed), or None when this wait
        should block: polling found nothing in the budget, or was not tried."""
        if not (self.budget_s and self.invited):
            return None
        if self._skip:
            self._skip -= 1
            return None
        if not self._quiet():
            return None
        clock = time.perf_counter
        until = clock() + self.budget_s
        recv, pause = sock.recv_into, os.sched_yield
        while True:
            try:
                received = recv(view, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if clock() < until:
                    pause()  # a thread or process waiting for this CPU goes first
                    continue
                self._missed()
                return None
            self._credit = min(self._credit + 1, MAX_CREDIT)
            self._misses = 0
            return received

    def _missed(self) -> None:
        if self._credit > 0:
            self._credit = max(self._credit - MISS_COST, 0)
            return
        self._misses = min(self._misses + 1, MAX_BACKOFF_EXPONENT)
        self._skip = 1 << self._misses
