"""grpc.health.v1 and server reflection on the gRPC port, on both doors, asked as
Kubernetes' probes and grpcurl ask: without a token."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from edgeplex.agent.catalog import demo
from tests.conftest import start_agent

SERVING, NOT_SERVING = (
    health_pb2.HealthCheckResponse.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING,
)
INFERENCE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module", params=["native", "grpcio"])
def agent(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"health-{request.param}")
    demo.make_mlp(tmp / "repo" / "mlp", width=16, layers=1)
    agent = start_agent(tmp / "repo", tmp, env={"EDGEPLEX_AGENT_GRPC_SERVER": request.param})
    yield agent
    assert agent.stop() == 0, agent.log()


def test_health_answers_for_the_server_and_each_service(agent) -> None:
    with grpc.insecure_channel(agent.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", INFERENCE, "edgeplex.v1.AgentControl"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == SERVING, service
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nope.Service"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert "nope.Service" in unknown.value.details()
        listed = health.List(health_pb2.HealthListRequest(), timeout=10).statuses
        assert {name: s.status for name, s in listed.items()}[INFERENCE] == SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=INFERENCE), timeout=10)
        assert next(watch).status == SERVING  # at once, then only on a change
        watch.cancel()


def test_reflection_lists_the_services_and_describes_their_methods(agent) -> None:
    with grpc.insecure_channel(agent.grpc_url) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {INFERENCE, "grpc.health.v1.Health", "edgeplex.v1.AgentControl"} <= services
        service = DescriptorPool(database).FindServiceByName(INFERENCE)
        methods = {m.name: m for m in service.methods}
        assert methods["ModelInfer"].input_type.full_name == "inference.ModelInferRequest"


def test_a_draining_agent_is_not_serving(tmp_path: Path) -> None:
    demo.make_mlp(tmp_path / "repo" / "mlp", width=16, layers=1)
    agent = start_agent(tmp_path / "repo", tmp_path, env={"EDGEPLEX_AGENT_DRAIN_TIMEOUT_S": "5"})
    try:
        with grpc.insecure_channel(agent.grpc_url) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert next(watch).status == SERVING
            # Draining, the port lets open calls finish (drain_timeout_s): the watch
            # hears the change before the port closes.
            agent.process.send_signal(signal.SIGTERM)
            assert next(watch).status == NOT_SERVING
            with pytest.raises(StopIteration):  # and the watch ends: it holds no shutdown
                next(watch)
            assert agent.process.wait(4) == 0  # well inside drain_timeout_s
    finally:
        agent.process.wait(60)
