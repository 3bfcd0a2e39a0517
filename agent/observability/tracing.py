"""OpenTelemetry export of the access log's spans (optional: the `otel` extra).

With `otlp_endpoint` set, every traced inference request (the caller's
traceparent says sampled, or the trace settings start one here: trace_settings.py)
becomes one SERVER span, sent over OTLP/HTTP by the SDK's batch processor, off
the event loop. The span carries the ids the access log prints and the forward
propagates: the trace id, this hop's span id (the parent of the peer's span),
and the caller's span id as its parent; its attributes are the access line's
fields. Export never slows a request: the batch queue drops spans when the
collector falls behind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeplex.agent.observability.access_log import AccessEntry

log = logging.getLogger("edgeplex.agent.observability.tracing")


class Spans:
    """Hands finished requests to an OTLP/HTTP exporter as spans."""

    def __init__(self, endpoint: str, service: str, site_id: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:  # the extra is not installed
            raise RuntimeError(
                "otlp_endpoint needs OpenTelemetry: pip install 'edgeplex[otel]'"
            ) from exc
        attributes = {"service.name": service}
        if site_id:
            attributes["edgeplex.site_id"] = site_id
        self._resource = Resource.create(attributes)
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))
        log.info("exporting request spans over OTLP/HTTP to %s", endpoint)

    def finished(
        self, access: AccessEntry, status: int | str, failed: bool, end_ns: int, ms: float
    ) -> None:
        if not access.traced:  # trace_settings.py decided
            return
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        flags = TraceFlags(int(access.flags, 16))
        context = SpanContext(int(access.trace_id, 16), int(access.span_id, 16), False, flags)
        parent = (
            SpanContext(int(access.trace_id, 16), int(access.parent_span_id, 16), True, flags)
            if access.parent_span_id
            else None
        )
        attributes: dict[str, Any] = {
            "edgeplex.door": access.door,
            "edgeplex.model": access.model,
            "edgeplex.model_version": access.version,
            "edgeplex.request_id": access.request_id,
            "edgeplex.tier": access.tier,
            "edgeplex.status": str(status),
        }
        if access.cold_start:
            attributes["edgeplex.cold_start"] = access.cold_start
        if access.forwarded_to:
            attributes["edgeplex.forwarded_to"] = access.forwarded_to
        span = ReadableSpan(
            name=f"infer {access.model}",
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            kind=SpanKind.SERVER,
            start_time=end_ns - int(ms * 1e6),
            end_time=end_ns,
            status=Status(StatusCode.ERROR if failed else StatusCode.OK),
        )
        self._processor.on_end(span)

    def close(self) -> None:
        self._processor.shutdown()
