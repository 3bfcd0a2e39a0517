"""A global cap on inference requests and request bytes in flight, and the one
place where overload sheds new work.

Both front doors pass through the one gate the agent holds before they read a
request's body: the native doors from the headers alone (Content-Length, or a
gRPC message's length prefix), the fallbacks as the handler starts. A request
beyond either cap, or any while the agent sheds load (its event loop late, its
memory short: overload.py), is refused at once (RESOURCE_EXHAUSTED / HTTP 429
with Retry-After): nothing was started for it, so the caller may retry.

Called from the event loop only.
"""

from __future__ import annotations

from collections.abc import Callable

from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import Overloaded


class Pass:
    """One request's hold on the gate, from admission to `release` (idempotent)."""

    __slots__ = ("_gate", "nbytes")

    def __init__(self, gate: InflightGate | None, nbytes: int) -> None:
        self._gate = gate
        self.nbytes = nbytes

    def grow(self, actual: int) -> None:
        """The body turned out larger than declared (a chunked upload declares
        nothing; a compressed one inflates): count the rest, or refuse."""
        extra = actual - self.nbytes
        if extra > 0 and self._gate is not None:
            self._gate.check(0, extra)
            self._gate.bytes += extra
            self.nbytes = actual

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.requests -= 1
            gate.bytes -= self.nbytes


class InflightGate:
    def __init__(
        self, max_requests: int, max_bytes: int, shedding: Callable[[], str | None] = lambda: None
    ) -> None:
        """`shedding`: the reason new work is refused now ("loop_lag", "memory"), or None."""
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests = 0
        self.bytes = 0
        self._shedding = shedding

    def check(self, requests: int, nbytes: int) -> None:
        if requests and (reason := self._shedding()) is not None:
            METRICS.shed.labels(reason=reason).inc()
            raise Overloaded(f"the agent is overloaded ({reason.replace('_', ' ')}); retry shortly")
        if self.requests + requests > self.max_requests:
            METRICS.shed.labels(reason="inflight_requests").inc()
            raise Overloaded(f"the agent holds {self.requests} requests, its limit; retry shortly")
        if nbytes and self.bytes + nbytes > self.max_bytes:
            METRICS.shed.labels(reason="inflight_bytes").inc()
            raise Overloaded(
                f"the agent holds {self.bytes} bytes of requests and {nbytes} more would pass "
                f"its {self.max_bytes}-byte limit; retry shortly"
            )

    def admit(self, declared_bytes: int) -> Pass:
        """Admit one request of `declared_bytes` (Content-Length, a message's length);
        the caller releases the pass when the request is over, whatever happened."""
        self.check(1, declared_bytes)
        self.requests += 1
        self.bytes += declared_bytes
        return Pass(self, declared_bytes)

    def hold(self, declared_bytes: int, admitted: Pass | None = None) -> Pass:
        """The pass of one request: `admitted`, the one its door took from the
        headers, grown to `declared_bytes`; else a new one. The caller releases it
        when the request is over (a second release, the door's, does nothing)."""
        if admitted is None:
            return self.admit(declared_bytes)
        admitted.grow(declared_bytes)
        return admitted
