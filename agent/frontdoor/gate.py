"""A global cap on inference requests and request bytes in flight.

Both front doors pass through the one gate the agent holds, before they read a
request's body when its size is declared. A request beyond either cap is
refused at once (RESOURCE_EXHAUSTED / HTTP 429 with Retry-After): nothing was
started for it, so the caller may retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from edgeplex.agent.errors import Overloaded


class Pass:
    """One request's hold on the gate."""

    def __init__(self, gate: InflightGate, nbytes: int) -> None:
        self._gate = gate
        self.nbytes = nbytes

    def grow(self, actual: int) -> None:
        """The body turned out larger than declared (a chunked upload declares
        nothing): count the rest, or refuse."""
        extra = actual - self.nbytes
        if extra > 0:
            self._gate.check(0, extra)
            self._gate.bytes += extra
            self.nbytes = actual


class InflightGate:
    def __init__(self, max_requests: int, max_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests = 0
        self.bytes = 0

    def check(self, requests: int, nbytes: int) -> None:
        if self.requests + requests > self.max_requests:
            raise Overloaded(f"the agent holds {self.requests} requests, its limit; retry shortly")
        if nbytes and self.bytes + nbytes > self.max_bytes:
            raise Overloaded(
                f"the agent holds {self.bytes} bytes of requests and {nbytes} more would pass "
                f"its {self.max_bytes}-byte limit; retry shortly"
            )

    @contextmanager
    def hold(self, declared_bytes: int) -> Iterator[Pass]:
        """Hold one request for its whole life; `declared_bytes` is its declared size
        (Content-Length, or the protobuf's size)."""
        self.check(1, declared_bytes)
        held = Pass(self, declared_bytes)
        self.requests += 1
        self.bytes += declared_bytes
        try:
            yield held
        finally:
            self.requests -= 1
            self.bytes -= held.nbytes
