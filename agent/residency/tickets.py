"""Admissions: what the residency owner hands a request it has admitted.

An admitted request holds a lease on its model from admission until its
response is ready (`Residency.release`). Either the model serves now (the
ticket is granted at once) or the request waits for the model's promotion:
the owner settles the ticket when the model is READY (the lease is then
taken in the same step, so no eviction can come between) or fails it when
the load fails. A waiter whose own deadline passes abandons its ticket.
"""

from __future__ import annotations

import asyncio

from edgeplex.agent.oip.errors import ServeError
from edgeplex.agent.residency.state import ModelKey


class Ticket:
    """One admitted request. `wait()` is for asyncio callers; the owner only calls
    `settle`, so tests drive tickets without a loop."""

    __slots__ = (
        "_future",
        "cold_start",
        "deadline",
        "error",
        "granted",
        "key",
        "lease",
        "settled",
    )

    def __init__(
        self,
        key: ModelKey,
        deadline: float,
        *,
        granted: bool,
        cold_start: str = "",
        lease: bool = True,
    ) -> None:
        self.key = key
        self.lease = lease  # False for verbs (load, demote) that wait but serve nothing
        self.deadline = deadline  # loop.time() seconds
        self.granted = granted  # holds a lease on a serving model
        self.settled = granted
        self.error: ServeError | None = None
        self.cold_start = cold_start  # the tier promoted from, "" when it was loaded
        self._future: asyncio.Future[None] | None = None

    def settle(self, error: ServeError | None) -> None:
        """Called by the owner: granted (error None, lease taken) or refused."""
        if self.settled:
            return
        self.settled = True
        self.granted = error is None and self.lease
        self.error = error
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait until settled or the deadline; False when the deadline came first."""
        if self.settled:
            return True
        self._future = loop.create_future()
        handle = loop.call_at(self.deadline, _expire, self._future)
        try:
            await self._future
        finally:
            handle.cancel()
        return self.settled


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
