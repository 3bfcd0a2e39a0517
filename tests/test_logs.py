"""`--log-format json`: every line the agent and its runners write is one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent


def test_json_logs_are_one_object_a_line(tmp_path: Path) -> None:
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    (tmp_path / "repo" / "broken").mkdir()
    agent = start_agent(tmp_path / "repo", tmp_path, env={"EDGEPLEX_AGENT_LOG_FORMAT": "json"})
    assert agent.stop() == 0, agent.log()
    records = [json.loads(line) for line in agent.log().splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["message"] == "agent ready" for r in records)


def test_an_access_line_per_request_with_its_trace(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    agent = start_agent(tmp_path / "repo", tmp_path, env={"EDGEPLEX_AGENT_LOG_FORMAT": "json"})
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    body = json.dumps({"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
        for n in ("INPUT0", "INPUT1")
    ]}).encode()  # fmt: skip
    try:
        for model, headers in (
            ("add_sub", {"traceparent": f"00-{trace}-00f067aa0ba902b7-01", "X-Request-ID": "r1"}),
            ("no_such_model", {}),
        ):
            request = urllib.request.Request(
                f"http://{agent.http_url}/v2/models/{model}/infer",
                data=body,
                headers={"Content-Type": "application/json", **headers},
            )
            try:
                urllib.request.urlopen(request, timeout=10).read()
            except urllib.error.HTTPError as exc:
                assert exc.code == 404
    finally:
        assert agent.stop() == 0, agent.log()
    records = [json.loads(line) for line in agent.log().splitlines() if line.strip()]
    access = [r for r in records if r["logger"] == "edgeplex.access"]
    ok = next(r for r in access if r["model"] == "add_sub")
    assert ok["request_id"] == "r1" and ok["trace_id"] == trace and ok["status"] == 200
    assert ok["door"] == "http" and ok["tier"] in ("loaded", "staged", "cached")
    assert ok["latency_ms"] > 0
    missing = next(r for r in access if r["model"] == "no_such_model")
    assert missing["status"] == 404 and len(missing["trace_id"]) == 32  # a new trace


def test_request_spans_go_to_an_otlp_collector(tmp_path: Path) -> None:
    """With otlp_endpoint set, a sampled request is one SERVER span over OTLP/HTTP,
    with the caller's trace and span as its parent; an unsampled one is not sent."""
    import http.server
    import threading
    import urllib.request

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    env = {
        "EDGEPLEX_AGENT_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    agent = start_agent(tmp_path / "repo", tmp_path, env=env)
    trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    unsampled = "0af7651916cd43dd8448eb211c80319c"
    body = json.dumps({"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
        for n in ("INPUT0", "INPUT1")
    ]}).encode()  # fmt: skip
    try:
        for traceparent in (f"00-{trace}-{parent}-01", f"00-{unsampled}-{parent}-00"):
            request = urllib.request.Request(
                f"http://{agent.http_url}/v2/models/add_sub/infer",
                data=body,
                headers={"traceparent": traceparent},
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 200
    finally:
        assert agent.stop() == 0, agent.log()  # flushes what is queued
        collector.shutdown()
    spans = []
    for payload in received:
        export = ExportTraceServiceRequest.FromString(payload)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans += [(resource.resource, span) for span in scope.spans]
    assert len(spans) == 1, spans
    resource, span = spans[0]
    assert span.trace_id.hex() == trace and span.parent_span_id.hex() == parent
    assert span.name == "infer add_sub" and span.kind == span.SPAN_KIND_SERVER
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["edgeplex.model"] == "add_sub" and attributes["edgeplex.status"] == "200"
    assert 0 < span.end_time_unix_nano - span.start_time_unix_nano < 10e9
    service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
    assert service == "edgeplex-agent"
