"""The access log: one line per inference request, from both front doors, on the
`edgeplex.access` logger.

A line says who asked for what and how it went: the request id, the W3C trace
id, the door, model and version, the model's tier when the request arrived,
the tier it was promoted from if it waited (cold start), the site it was
forwarded to, the status and the latency. With `--log-format json` each is a
field of the record. Up to `access_log_rate` lines a second are written; above
that, successes are sampled (failures are always written) and a summary line
says how many were left out. Trace context (`traceparent`) is accepted from the
caller, and a forwarded request carries it on with this site's span as the
parent. With `otlp_endpoint` set, each traced request (trace_settings.py) is also
an OpenTelemetry span with the same ids (tracing.py), whatever the line rate.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgeplex.agent.observability.trace_settings import TraceSettings

if TYPE_CHECKING:
    from edgeplex.agent.observability.tracing import Spans

log = logging.getLogger("edgeplex.access")

TRACEPARENT = "traceparent"
REQUEST_ID = "x-request-id"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
SUMMARY_EVERY_S = 10.0


def trace_of(traceparent: str | None) -> tuple[str, str, str]:
    """(trace id, parent span id, flags) of a valid W3C traceparent; no trace id
    (one is drawn when first needed) and no parent when it is absent or invalid
    (all-zero ids and version ff are invalid)."""
    if not traceparent:
        return "", "", "01"
    m = _TRACEPARENT.match(traceparent.strip().lower())
    if m and m.group(1) != "ff" and set(m.group(2)) != {"0"} and set(m.group(3)) != {"0"}:
        return m.group(2), m.group(3), m.group(4)
    return "", "", "01"


def _random_id(bits: int) -> str:
    """A random, non-zero trace or span id in hex. Mersenne Twister, as
    OpenTelemetry's SDK draws them: ids must be unique, not secret, and a
    getrandom() call per request cost the agent about a tenth of its CPU. Python
    reseeds the generator in a forked child."""
    while not (value := random.getrandbits(bits)):
        pass
    return f"{value:0{bits // 4}x}"


@dataclass(slots=True)
class AccessEntry:
    door: str
    model: str
    version: str
    _request_id: str  # the caller's; "" when it gave none (the trace id stands in)
    _trace_id: str  # the caller's trace; "" until one is drawn (trace_id)
    flags: str
    parent_span_id: str = ""  # the caller's span; "" when the trace started here
    traced: bool = False  # a span for it is exported (trace_settings.py decides)
    # At arrival: loaded, staged, cached ("" when not in the repository). Set by the
    # door when the request ends: a served one's tier is known from its cold start,
    # so no lookup is made on the way in.
    tier: str = ""
    _span_id: str = ""  # this hop's, drawn when first needed (span_id)
    started: float = field(default_factory=time.perf_counter)
    cold_start: str = ""
    forwarded_to: str = ""
    tenant: str = ""  # whose request (frontdoor/tenants.py); "" before the key is checked

    @property
    def trace_id(self) -> str:
        """The caller's trace, or a new one: drawn only for a line written, a span
        exported or a forward, not on every request."""
        if not self._trace_id:
            self._trace_id = _random_id(128)
        return self._trace_id

    @property
    def request_id(self) -> str:
        return self._request_id or self.trace_id

    @property
    def span_id(self) -> str:
        """This hop's span id: drawn only for a forward or an exported span."""
        if not self._span_id:
            self._span_id = _random_id(64)
        return self._span_id

    def forward_traceparent(self) -> str:
        """The traceparent a forward carries: same trace, this hop as the parent."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


class AccessLog:
    def __init__(self, rate_per_s: float = 100.0) -> None:
        self.configure(rate_per_s)

    def configure(self, rate_per_s: float, spans: Spans | None = None) -> None:
        self.spans = spans
        self.traces = TraceSettings(exporting=spans is not None)
        self.rate = rate_per_s
        self._tokens = rate_per_s
        self._refilled = time.monotonic()
        self._dropped = 0
        self._summarised = self._refilled

    def start(
        self,
        door: str,
        model: str,
        version: str,
        traceparent: str | None,
        request_id: str | None,
    ) -> AccessEntry:
        trace_id, parent, flags = trace_of(traceparent)
        sampler = self.traces.of(model)
        if parent:  # the caller's trace, and its decision
            traced = int(flags, 16) & 1 == 1 and sampler.level != "OFF"
        else:
            traced = sampler.start()
            flags = "01" if traced else "00"
        rid = request_id[:128] if request_id else ""
        return AccessEntry(door, model, version, rid, trace_id, flags, parent, traced)

    def finish(self, access: AccessEntry, status: int | str, failed: bool) -> None:
        if self.spans is not None:
            ms = (time.perf_counter() - access.started) * 1000
            self.spans.finished(access, status, failed, time.time_ns(), ms)
        if self.rate <= 0:
            return
        now = time.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        if self._tokens < 1 and not failed:
            if not self._dropped:
                self._summarised = now
            self._dropped += 1
            self._summary(now)
            return
        self._tokens = max(0.0, self._tokens - 1)
        ms = (time.perf_counter() - access.started) * 1000
        fields = {
            "request_id": access.request_id,
            "trace_id": access.trace_id,
            "door": access.door,
            "model": access.model,
            "version": access.version,
            "tier": access.tier,
            "cold_start": access.cold_start,
            "forwarded_to": access.forwarded_to,
            "tenant": access.tenant,
            "status": status,
            "latency_ms": round(ms, 3),
        }
        log.info(
            "%s %s %s:%s status=%s %.1f ms tier=%s%s%s%s trace=%s",
            access.door,
            access.request_id,
            access.model,
            access.version or "-",
            status,
            ms,
            access.tier or "-",
            f" cold_start={access.cold_start}" if access.cold_start else "",
            f" forwarded_to={access.forwarded_to}" if access.forwarded_to else "",
            f" tenant={access.tenant}" if access.tenant not in ("", "anonymous") else "",
            access.trace_id,
            extra=fields,
        )
        self._summary(now)

    def _summary(self, now: float) -> None:
        if self._dropped and now - self._summarised >= SUMMARY_EVERY_S:
            log.info(
                "access log over %g lines/s: %d successful requests not logged in %.0f s",
                self.rate,
                self._dropped,
                now - self._summarised,
                extra={"not_logged": self._dropped},
            )
            self._dropped = 0
            self._summarised = now


ACCESS = AccessLog()
