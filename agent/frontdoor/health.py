"""grpc.health.v1 on the agent's gRPC port, as Kubernetes' gRPC probes and
grpc-health-probe ask it, and server reflection, as grpcurl lists services.

The server ("") and each service the port serves are SERVING while the agent is
ready (started, not draining, a runner able to serve: the same answer as
/v2/health/ready) and NOT_SERVING otherwise; a service the port does not serve
is NOT_FOUND (`Watch`: SERVICE_UNKNOWN, as the protocol says). `Watch` sends the
status at once, then each change, until the caller leaves. Both are open, like
Triton's health endpoints: probes carry no token, and neither says anything a
caller could not learn from /v2/health/ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.core import Agent

HEALTH = "grpc.health.v1.Health"
WATCH_POLL_S = 1.0  # how often a Watch looks for a change of status
Status = health_pb2.HealthCheckResponse


class HealthServicer:
    def __init__(self, agent: Agent, services: list[str]) -> None:
        self.agent = agent
        self.services = ["", *services]

    def _status(self, service: str) -> int | None:
        if service not in self.services:
            return None
        return Status.SERVING if self.agent.ready() else Status.NOT_SERVING

    async def Check(self, request: Any, context: Any) -> Any:
        status = self._status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return Status(status=status)

    async def List(self, request: Any, context: Any) -> Any:
        return health_pb2.HealthListResponse(
            statuses={name: Status(status=self._status(name)) for name in self.services}
        )

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """The status now, then each change; once the agent drains, NOT_SERVING and the
        end of the call (a watch would otherwise hold the shutdown for its grace)."""
        last = None
        while True:
            status = self._status(request.service)
            status = Status.SERVICE_UNKNOWN if status is None else status
            if status != last:
                yield Status(status=status)
                last = status
            if self.agent.draining:
                return
            await asyncio.sleep(WATCH_POLL_S)


def add_health_and_reflection(agent: Agent, services: list[ServiceDescriptor], server: Any) -> None:
    """Register both on `server` (grpcio's, or the native door's method table),
    for `services` and themselves."""
    names = [s.full_name for s in services]
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(agent, names), server)
    names += [HEALTH, reflection.SERVICE_NAME]
    # The services' descriptors live in their generated modules' own pools (so
    # that OIP's inference.proto never clashes with tritonclient's copy of it).
    pool = Pools([s.file.pool for s in services] + [descriptor_pool.Default()])
    # The asyncio servicer on both doors: the native door awaits every handler.
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)


class Pools:
    """Descriptor pools asked in turn: what the reflection servicer asks of one."""

    def __init__(self, pools: list[Any]) -> None:
        self._pools = list({id(p): p for p in pools}.values())

    def _first(self, method: str, *args: Any) -> Any:
        for pool in self._pools:
            try:
                return getattr(pool, method)(*args)
            except KeyError:
                continue
        raise KeyError(f"{method}{args}: in no descriptor pool")

    def FindFileByName(self, name: str) -> Any:
        return self._first("FindFileByName", name)

    def FindFileContainingSymbol(self, symbol: str) -> Any:
        return self._first("FindFileContainingSymbol", symbol)

    def FindMessageTypeByName(self, name: str) -> Any:
        return self._first("FindMessageTypeByName", name)

    def FindExtensionByNumber(self, message: Any, number: int) -> Any:
        return self._first("FindExtensionByNumber", message, number)

    def FindAllExtensions(self, message: Any) -> Any:
        return self._first("FindAllExtensions", message)
