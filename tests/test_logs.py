"""What the agent says of its work: `--log-format json` (every line the agent and its
runners write is one JSON object), the access log, and request spans over OTLP with
Triton's trace settings."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.observability.trace_settings import TraceSettings
from edgeplex.agent.oip.errors import InvalidInput
from tests.conftest import AUTH, start_agent


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


class Collector:
    """An OTLP/HTTP trace collector on a free loopback port, keeping what it is sent."""

    def __init__(self) -> None:
        import http.server
        import threading

        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/traces"

    def spans(self) -> list:  # type: ignore[type-arg]
        """(resource, span) of every span received."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        spans = []
        for payload in self.received:
            export = ExportTraceServiceRequest.FromString(payload)
            for resource in export.resource_spans:
                for scope in resource.scope_spans:
                    spans += [(resource.resource, span) for span in scope.spans]
        return spans

    def shutdown(self) -> None:
        self.server.shutdown()


def test_request_spans_go_to_an_otlp_collector(tmp_path: Path) -> None:
    """With otlp_endpoint set, a sampled request is one SERVER span over OTLP/HTTP,
    with the caller's trace and span as its parent; an unsampled one is not sent."""
    collector = Collector()
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    env = {
        "EDGEPLEX_AGENT_OTLP_ENDPOINT": collector.url,
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
    spans = collector.spans()
    assert len(spans) == 1, spans
    resource, span = spans[0]
    assert span.trace_id.hex() == trace and span.parent_span_id.hex() == parent
    assert span.name == "infer add_sub" and span.kind == span.SPAN_KIND_SERVER
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["edgeplex.model"] == "add_sub" and attributes["edgeplex.status"] == "200"
    assert 0 < span.end_time_unix_nano - span.start_time_unix_nano < 10e9
    service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
    assert service == "edgeplex-agent"


def _add_sub(module, client, model: str = "add_sub", headers=None) -> None:  # type: ignore[no-untyped-def]
    inputs = [module.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    client.infer(model, inputs, headers=headers)


def test_trace_settings_choose_the_requests_traced(tmp_path: Path) -> None:
    """Triton's trace extension over both protocols: the rate and the count choose
    the traces started here, a model may set its own level, and a caller's sampled
    trace is followed unless its model's level is OFF."""
    collector = Collector()
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    demo.make_add_sub(tmp_path / "repo" / "quiet")
    env = {"EDGEPLEX_AGENT_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    agent = start_agent(tmp_path / "repo", tmp_path, env=env)
    http = th.InferenceServerClient(agent.http_url)
    grpc = tg.InferenceServerClient(agent.grpc_url)
    followed = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    try:
        assert "trace" in http.get_server_metadata()["extensions"]
        assert http.get_trace_settings() == {
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
            "log_frequency": "0", "trace_file": "", "trace_mode": "opentelemetry",
        }  # fmt: skip
        # One trace in two requests, three in all: the 2nd, 4th and 6th of ten.
        http.update_trace_settings(settings={"trace_rate": "2", "trace_count": "3"}, headers=AUTH)
        for _ in range(10):
            _add_sub(th, http)
        assert http.get_trace_settings()["trace_count"] == "0"
        # A model's own level; its other settings follow the agent's.
        quiet = grpc.update_trace_settings(
            "quiet", {"trace_level": ["OFF"]}, headers=AUTH, as_json=True
        )["settings"]
        assert quiet["trace_level"]["value"] == ["OFF"]
        assert quiet["trace_rate"]["value"] == ["2"]
        http.update_trace_settings(settings={"trace_count": "-1", "trace_rate": "1"}, headers=AUTH)
        assert http.get_trace_settings("quiet")["trace_rate"] == "1"
        _add_sub(tg, grpc, "quiet", followed)  # not traced: OFF
        _add_sub(tg, grpc, "add_sub", followed)  # the caller's trace, followed
        http.update_trace_settings("quiet", {"trace_level": None}, headers=AUTH)  # the agent's
        assert http.get_trace_settings("quiet")["trace_level"] == ["TIMESTAMPS"]

        for settings, error in (
            ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
            ({"trace_file": "trace.json"}, "'trace_file' is ''"),
            ({"trace_rate": "0"}, "'trace_rate' must be an integer from 1"),
            ({"trace_verbosity": "1"}, "no setting 'trace_verbosity'"),
        ):
            for client in (http, grpc):
                with pytest.raises(InferenceServerException, match=error):
                    client.update_trace_settings(settings=settings, headers=AUTH)
        with pytest.raises(InferenceServerException, match="needs 'Authorization: Bearer"):
            http.update_trace_settings(settings={"trace_rate": "5"})
        with pytest.raises(InferenceServerException, match="unknown model"):
            grpc.get_trace_settings("no_such_model")
        assert http.get_trace_settings()["trace_rate"] == "1"  # nothing applied
    finally:
        http.close()
        grpc.close()
        assert agent.stop() == 0, agent.log()  # flushes what is queued
        collector.shutdown()
    spans = [span for _, span in collector.spans()]
    started_here = [s for s in spans if not s.parent_span_id]
    assert len(started_here) == 3, spans
    assert all(s.name == "infer add_sub" for s in spans)
    assert [s.parent_span_id.hex() for s in spans if s.parent_span_id] == ["00f067aa0ba902b7"]


def test_without_an_exporter_tracing_stays_off(tmp_path: Path) -> None:
    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    agent = start_agent(tmp_path / "repo", tmp_path)
    http = th.InferenceServerClient(agent.http_url)
    try:
        assert http.get_trace_settings()["trace_level"] == ["OFF"]
        with pytest.raises(InferenceServerException, match="needs the agent's otlp_endpoint"):
            http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, headers=AUTH)
    finally:
        http.close()
        assert agent.stop() == 0, agent.log()


def test_a_models_trace_settings_follow_the_agents_but_for_its_own() -> None:
    traces = TraceSettings(exporting=True)
    traces.update({"trace_rate": "4"}, "m")
    traces.update({"trace_count": "2", "trace_rate": "3"})  # the agent's
    assert traces.view("m")["trace_rate"] == "4" and traces.view("m")["trace_count"] == "2"
    assert [traces.of("m").start() for _ in range(16)] == [i in (3, 7) for i in range(16)]
    assert traces.view("m")["trace_count"] == "0" and traces.view()["trace_count"] == "2"
    with pytest.raises(InvalidInput, match="TENSORS"):  # checked whole, before any change
        traces.update({"trace_rate": "2", "trace_level": ["TENSORS"]})
    assert traces.view()["trace_rate"] == "3"
    traces.update({"trace_rate": None}, "m")  # nothing of its own left: the agent's
    assert traces.of("m") is traces.of("other")
    traces.update({"trace_rate": None, "trace_count": None})  # the agent's start
    assert traces.view()["trace_rate"] == "1" and traces.view()["trace_count"] == "-1"
