"""The OIP v2 gRPC front door (inference.GRPCInferenceService).

Decodes protobuf requests into `core.Agent` calls and encodes the results;
ServeError becomes the gRPC status it names. Outputs always travel in
raw_output_contents, as Triton sends them.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig as ModelConfigMessage

from edgeplex.agent.batching.sequences import Flags, flags_of
from edgeplex.agent.fleet.forward import (
    NOT_HERE,
    SEQUENCE_NOT_HERE,
    SERVED_BY,
    Forwarded,
    GrpcForward,
)
from edgeplex.agent.frontdoor.auth import Access, Credentials
from edgeplex.agent.frontdoor.grpc_body import decode_inputs, request_bytes, request_timeouts
from edgeplex.agent.frontdoor.health import add_health_and_reflection
from edgeplex.agent.frontdoor.shared_memory import (
    BYTE_SIZE,
    REGION,
    ClientRegions,
    Ref,
    grpc_params,
    ref_of,
)
from edgeplex.agent.frontdoor.stream_calls import side_by_side, until_set
from edgeplex.agent.observability.access_log import ACCESS, REQUEST_ID, TRACEPARENT
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import (
    InvalidInput,
    Overloaded,
    ServeError,
)
from edgeplex.agent.oip.requests import InferInput
from edgeplex.agent.oip.tensors import oip_datatype, raw_view, to_raw
from edgeplex.net import grpc_silence_options
from edgeplex.proto import edgeplex_agent_pb2 as ctl
from edgeplex.proto import edgeplex_agent_pb2_grpc as ctl_grpc
from edgeplex.proto import inference_pb2 as pb
from edgeplex.proto import inference_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.core import Agent

log = logging.getLogger("edgeplex.agent.grpc")
# The services of the gRPC port (health and reflection answer for them).
SERVICES = [
    pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
    ctl.DESCRIPTOR.services_by_name["AgentControl"],
]

# Trailing metadata set when the request waited for its model's promotion.
COLD_START = "edgeplex-cold-start"
VARIANT = "edgeplex-variant"  # a quantized variant served it (absent: as shipped)


def _serve_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except ServeError as exc:
            await _abort(context, exc)

    return wrapper


async def _abort(context: grpc.aio.ServicerContext, exc: ServeError) -> NoReturn:
    """End the call with the error's status, and its Retry-After and not-here trailers."""
    retry = exc.retry_after_s
    trailers: tuple[tuple[str, str], ...] = (
        () if retry is None else (("retry-after", f"{retry:g}"),)
    )
    trailers += ((NOT_HERE, "1"),) if exc.not_here else ()
    trailers += ((SEQUENCE_NOT_HERE, "1"),) if exc.sequence_not_here else ()
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(exc.grpc_code, exc.message)
    raise AssertionError("context.abort raises")  # typed as returning


def authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return value
    return None


def _requires(access: Access) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Check the caller's `authorization` metadata before the method runs (inside
    _serve_errors, which turns a refusal into UNAUTHENTICATED / PERMISSION_DENIED)."""

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        what = method.__name__

        @functools.wraps(method)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            self.credentials.check(access, authorization(context), what, context.peer())
            return await method(self, request, context)

        return wrapper

    return decorate


def _sequence_of(request: pb.ModelInferRequest) -> tuple[str, str, int | str] | None:
    """The sequence a streamed request belongs to (model, version, correlation id),
    whose requests the call serves in order; None for one outside any sequence."""
    sequence_id = grpc_params(request.parameters).get("sequence_id") if request.parameters else None
    if sequence_id in (None, 0, "") or not isinstance(sequence_id, int | str):
        return None
    return (request.model_name, request.model_version, sequence_id)


def _output_parameters(
    request: pb.ModelInferRequest, regions: ClientRegions | None
) -> tuple[dict[str, Ref], dict[str, int]]:
    """What the requested outputs' parameters ask for, read in one pass: those to write
    into shared memory, by name (checked before the model runs: a region no one
    registered is refused first), and those asked for as classifications, with how
    many classes each."""
    shm: dict[str, Ref] = {}
    classify: dict[str, int] = {}
    for output in request.outputs:
        if not output.parameters:
            continue
        params = grpc_params(output.parameters)
        ref = ref_of(params, output.name)
        if ref is not None:
            if regions is None:
                raise InvalidInput(
                    f"output '{output.name}': Unable to find system shared memory "
                    f"region: '{ref.region}'"
                )
            shm[output.name] = ref
        count = params.get("classification")
        if count is not None:
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise InvalidInput(
                    f"output '{output.name}': 'classification' must be a non-negative integer"
                )
            if count:
                classify[output.name] = count
    return shm, classify


@dataclass(frozen=True)
class Body:
    """A ModelInfer request decoded: what the core serves from it."""

    inputs: list[InferInput]
    outputs: list[str] | None
    timeout_s: float | None
    sequence: Flags | None = None  # a stateful model's request: its sequence and place
    shm_outputs: dict[str, Ref] | None = None  # outputs to write into shared memory
    priority: int = 0  # the `priority` parameter (0: none)
    classify: dict[str, int] = field(default_factory=dict)  # output: top k (classification)
    deadline_s: float | None = None  # the gRPC deadline alone (timeout_s: or the parameter)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, agent: Agent, credentials: Credentials) -> None:
        self.agent = agent
        self.credentials = credentials

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.agent.live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.agent.ready())

    @_serve_errors
    @_requires(Access.CLIENT)
    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        try:
            if (peer := await self._asked_elsewhere("ModelReady", request, context)) is not None:
                return peer
        except ServeError:  # not in the fleet's catalog, or its artifact failed: not ready
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.agent.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.agent.server_metadata())

    @_serve_errors
    @_requires(Access.CLIENT)
    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        if (peer := await self._asked_elsewhere("ModelMetadata", request, context)) is not None:
            return peer
        meta = self.agent.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    @_serve_errors
    @_requires(Access.CLIENT)
    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        """The same config as HTTP's, every field of it: built as Triton's own
        ModelConfig message and carried in ours, whose fewer fields keep the rest
        as unknown fields, which go out on the wire unchanged."""
        if (peer := await self._asked_elsewhere("ModelConfig", request, context)) is not None:
            return peer
        config = self.agent.model_config(request.name, request.version)
        full = json_format.ParseDict(config, ModelConfigMessage(), ignore_unknown_fields=True)
        response = pb.ModelConfigResponse()
        response.config.MergeFromString(full.SerializeToString())
        return response

    async def _asked_elsewhere(self, method: str, request: Any, context: Any) -> Any:
        """A model this site does not know, but a peer holds: the peer's answer."""
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        return await self.agent.ask_grpc(
            request.name, request.version, method, request, metadata.get
        )

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        # As _serve_errors and _requires(Access.CLIENT) would, without their two
        # coroutines on every call.
        try:
            caller = self.credentials.check(Access.CLIENT, authorization(context), "ModelInfer")
            return await self._infer(request, context, caller)
        except ServeError as exc:
            await _abort(context, exc)

    async def _infer(
        self, request: pb.ModelInferRequest, context: Any, caller: str = ""
    ) -> pb.ModelInferResponse:
        """One inference call: held by the in-flight gate, logged, and served by the
        core's one entry point (one coroutine on the call's way)."""
        agent = self.agent
        name = request.model_name
        try:
            # The native door admitted unary calls already (their message's length).
            admitted = getattr(context, "admitted", None)
            declared = 0 if admitted is not None else request_bytes(request)
            held = agent.gate.hold(declared, admitted)
        except Overloaded:
            METRICS.refused.labels(model=agent.metric_label(name)).inc()
            raise
        try:
            metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
            request_id = metadata.get(REQUEST_ID) or request.id
            traceparent = metadata.get(TRACEPARENT)
            access = ACCESS.start("grpc", name, request.model_version, traceparent, request_id)
            timeout_s, deadline_s = request_timeouts(request, context)  # the time left

            shared = agent.shared_memory
            regions = ClientRegions(
                shared, self.credentials, metadata.get("authorization"), context.peer()
            ) if shared.registered else None  # fmt: skip

            decoded: list[Body] = []  # the body as the core read it (none if forwarded)

            def decode() -> Body:
                inputs = decode_inputs(request, agent.settings.max_payload_bytes, regions)
                wanted = [o.name for o in request.outputs] or None
                flags, priority = None, 0
                if request.parameters:  # most requests carry none
                    params = grpc_params(request.parameters)
                    flags, priority = flags_of(params), _priority(params)
                shm, classify = _output_parameters(request, regions)
                body = Body(inputs, wanted, timeout_s, flags, shm, priority, classify, deadline_s)
                decoded.append(body)
                return body

            try:
                access.tenant = agent.tenants.resolve(caller, metadata.get)
                outcome = await agent.handle(
                    name,
                    request.model_version,
                    metadata.get,
                    GrpcForward(request, deadline_s),  # `timeout` goes as it came
                    decode,
                    access.forward_traceparent,
                    arrived=getattr(context, "received", None),  # the native door's; grpcio: now
                    caller=access.tenant,
                )
            except ServeError as exc:
                access.tier = agent.tier_of(name)
                ACCESS.finish(access, exc.grpc_code.name, failed=True)
                raise
        finally:
            held.release()
        if isinstance(outcome, Forwarded):
            reply, passed = outcome.reply  # type: ignore[misc]  # gRPC: served-by first
            access.forwarded_to = passed[0][1]
            access.tier = agent.tier_of(name)
            ACCESS.finish(access, "OK", failed=False)
            context.set_trailing_metadata(passed)
            return reply  # type: ignore[return-value]
        result = outcome
        # Shared-memory outputs are written before the call counts as served.
        written = {}
        shm = decoded[0].shm_outputs if decoded else None
        if shm and regions is not None:
            for name, place in shm.items():
                if name in result.outputs:
                    blob = raw_view(result.outputs[name])
                    regions.write(place, name, memoryview(blob))
                    written[name] = (place, len(blob))
        access.tier = result.cold_start or "loaded"
        access.cold_start = result.cold_start
        ACCESS.finish(access, "OK", failed=False)
        trailers = []
        if result.cold_start:
            trailers.append((COLD_START, result.cold_start))
        if result.variant:
            trailers.append((VARIANT, result.variant))
        if result.served_by:
            trailers.append((SERVED_BY, result.served_by))
        if trailers:
            context.set_trailing_metadata(tuple(trailers))
        response = pb.ModelInferResponse(
            model_name=result.entry.name, model_version=result.entry.version, id=request.id
        )
        for name, array in result.outputs.items():
            out = response.outputs.add(name=name, datatype=oip_datatype(array), shape=array.shape)
            if name not in written:
                response.raw_output_contents.append(to_raw(array))
                continue
            place, size = written[name]
            out.parameters[REGION].string_param = place.region
            out.parameters[BYTE_SIZE].int64_param = size
            response.raw_output_contents.append(b"")  # in place, so the others keep their index
        return response

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        token = next(
            (v for k, v in context.invocation_metadata() or () if k == "authorization"), None
        )
        try:
            self.credentials.check(Access.CLIENT, token, "ModelStreamInfer")
        except ServeError as exc:
            await context.abort(exc.grpc_code, exc.message)

        async def serve(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
            try:
                return pb.ModelStreamInferResponse(
                    infer_response=await self._infer(request, context)
                )
            except ServeError as exc:
                return pb.ModelStreamInferResponse(error_message=exc.message)

        # As many requests outstanding as a connection may have calls: the gate bounds
        # their bytes; a stream that read less could stop reading the END that frees
        # the sequence slot its waiting STARTs need.
        limit = self.agent.settings.doors.max_concurrent_streams
        async for response in side_by_side(request_iterator, serve, limit, _sequence_of):
            yield response

    @_serve_errors
    @_requires(Access.CLIENT)
    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        stats = self.agent.statistics(request.name, request.version)
        response = pb.ModelStatisticsResponse()
        for item in stats:
            model = response.model_stats.add(
                name=item["name"],
                version=item["version"],
                last_inference=item["last_inference"],
                inference_count=item["inference_count"],
                execution_count=item["execution_count"],
            )
            for key, value in item["inference_stats"].items():
                getattr(model.inference_stats, key).CopyFrom(pb.StatisticDuration(**value))
            for batch in item["batch_stats"]:
                model.batch_stats.add(
                    batch_size=batch["batch_size"],
                    compute_input=pb.StatisticDuration(**batch["compute_input"]),
                    compute_infer=pb.StatisticDuration(**batch["compute_infer"]),
                    compute_output=pb.StatisticDuration(**batch["compute_output"]),
                )
        return response

    @_serve_errors
    @_requires(Access.CLIENT)
    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=m["name"], version=m["version"], state=m["state"], reason=m["reason"]
                )
                for m in self.agent.repository_index(request.ready)
            ]
        )

    @_serve_errors
    @_requires(Access.CONTROL)
    async def RepositoryModelLoad(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        parameters = request.parameters
        config = parameters["config"].string_param if "config" in parameters else None
        files = {k: v.bytes_param for k, v in parameters.items() if k.startswith("file:")}
        await self.agent.load(request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    @_serve_errors
    @_requires(Access.CONTROL)
    async def RepositoryModelUnload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        dependents = grpc_params(request.parameters).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput("unload: 'unload_dependents' must be a bool")
        await self.agent.unload(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    @_serve_errors
    @_requires(Access.CLIENT)
    async def LogSettings(self, request: Any, context: Any) -> pb.LogSettingsResponse:
        """Triton's logging extension: the settings named change (with the admin token),
        all are answered."""
        changes = grpc_params(request.settings)
        if changes:
            auth = authorization(context)
            self.credentials.check(Access.ADMIN, auth, "LogSettings", context.peer())
            settings = self.agent.log_settings.update(changes)
        else:
            settings = self.agent.log_settings.view()
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response

    @_serve_errors
    @_requires(Access.CLIENT)
    async def TraceSetting(self, request: Any, context: Any) -> pb.TraceSettingResponse:
        """Triton's trace extension, for the agent or `model_name`: the settings named
        change (with the admin token; no value clears one), all are answered."""
        changes = {key: list(value.value) or None for key, value in request.settings.items()}
        if changes:
            auth = authorization(context)
            self.credentials.check(Access.ADMIN, auth, "TraceSetting", context.peer())
        settings = self.agent.trace_settings(request.model_name, changes)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @_serve_errors
    @_requires(Access.LOCAL)
    async def SystemSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.agent.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    @_serve_errors
    @_requires(Access.LOCAL)
    async def SystemSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        shared = self.agent.shared_memory
        shared.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_serve_errors
    @_requires(Access.LOCAL)
    async def SystemSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.agent.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_serve_errors
    @_requires(Access.LOCAL)
    async def CudaSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self.agent.shared_memory.status(request.name, cuda=True):
            response.regions[region["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    @_serve_errors
    @_requires(Access.LOCAL)
    async def CudaSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        shared = self.agent.shared_memory
        shared.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @_serve_errors
    @_requires(Access.LOCAL)
    async def CudaSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.agent.shared_memory.unregister(request.name, cuda=True)
        return pb.CudaSharedMemoryUnregisterResponse()


class ControlServicer(ctl_grpc.AgentControlServicer):
    """edgeplex.v1.AgentControl: the residency verbs (pin, unpin, demote, memory)."""

    def __init__(self, agent: Agent, credentials: Credentials) -> None:
        self.agent = agent
        self.credentials = credentials

    @_serve_errors
    @_requires(Access.ADMIN)
    async def Pin(self, request: Any, context: Any) -> ctl.Ack:
        self.agent.pin(request.name, True)
        return ctl.Ack()

    @_serve_errors
    @_requires(Access.ADMIN)
    async def Unpin(self, request: Any, context: Any) -> ctl.Ack:
        self.agent.pin(request.name, False)
        return ctl.Ack()

    @_serve_errors
    @_requires(Access.ADMIN)
    async def Demote(self, request: Any, context: Any) -> ctl.Ack:
        await self.agent.demote(request.name, request.tier or "staged")
        return ctl.Ack()

    @_serve_errors
    @_requires(Access.CLIENT)
    async def Memory(self, request: Any, context: Any) -> ctl.MemoryResponse:
        memory = self.agent.memory()
        response = ctl.MemoryResponse(policy=memory["policy"])
        for tier, usage in memory["tiers"].items():
            response.tiers[tier].bytes = usage["bytes"]
            response.tiers[tier].budget = usage["budget"] or 0
        return response


class _Undecodable:
    """What a request message that does not parse becomes (see _StrictMessages)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _StrictMessages:
    """Registers the generated method handlers on grpcio's server with a message that
    does not parse answered INVALID_ARGUMENT, naming the fault (grpcio itself answers
    UNKNOWN with no reason), and a streaming call's requests ending once `ending` is
    set (an idle client would otherwise hold the server's stop for its whole grace).
    The native door does both in its own call path."""

    def __init__(self, server: grpc.aio.Server, ending: asyncio.Event) -> None:
        self._server, self._ending = server, ending

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the registered handlers below carry the same methods

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        strict = {name: _strict(handler, self._ending) for name, handler in handlers.items()}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, strict),)
        )
        self._server.add_registered_method_handlers(service, strict)


def _strict(handler: grpc.RpcMethodHandler, ending: asyncio.Event) -> grpc.RpcMethodHandler:
    deserialize = handler.request_deserializer

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError and friends
            return _Undecodable(f"the request message does not parse: {exc}")

    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        behavior = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, parse, serialize)
    if handler.stream_stream is not None:
        streaming = handler.stream_stream

        async def stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async def checked() -> AsyncIterator[Any]:
                async for request in until_set(requests, ending):
                    if isinstance(request, _Undecodable):
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
                    yield request

            async for response in streaming(checked(), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(stream, parse, serialize)
    return handler  # no other kind is served


def native_door(choice: str) -> bool:
    """Whether gRPC is served by the native door (see AgentSettings.grpc_server)."""
    if choice == "grpcio":
        return False
    try:  # built here, and its libnghttp2 loads
        importlib.import_module("edgeplex.agent.frontdoor._nghttp2")
        built = True
    except ImportError:
        built = False
    if choice == "native" and not built:
        raise RuntimeError(
            "grpc_server: native needs its HTTP/2 session built (python scripts/build_native.py)"
        )
    return built


async def start_grpc_server(
    agent: Agent,
    credentials: Credentials,
    tls: tuple[ssl.SSLContext, grpc.ServerCredentials] | None = None,
) -> tuple[Any, int]:
    """Start serving; returns the server (with `stop(grace)`) and the bound port.
    `tls`: the native door's context (ALPN h2) and grpcio's credentials."""
    settings = agent.settings
    limit = 2 * settings.max_payload_bytes + 1024 * 1024

    inference = InferenceServicer(agent, credentials)

    def register(server: Any) -> None:
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(inference, server)
        ctl_grpc.add_AgentControlServicer_to_server(ControlServicer(agent, credentials), server)
        add_health_and_reflection(agent, SERVICES, server)

    if native_door(settings.grpc_server):
        from edgeplex.agent.frontdoor.grpc_native import NativeGrpcDoor

        door = NativeGrpcDoor(register, limit, agent.gate, settings.doors)
        port = await door.start(settings.grpc_host, settings.grpc_port, tls and tls[0])
        log.info("gRPC door: native (nghttp2) on the event loop%s", " over TLS" if tls else "")
        return door, port
    doors = settings.doors
    ms = 1000
    server = grpc.aio.server(
        # grpcio's equivalents of the native door's limits (what its core offers).
        maximum_concurrent_rpcs=settings.max_inflight_requests,
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", doors.max_concurrent_streams),
            ("grpc.max_metadata_size", doors.max_header_bytes),
            ("grpc.http2.min_ping_interval_without_data_ms", int(doors.min_ping_interval_s * ms)),
            ("grpc.http2.max_ping_strikes", 2),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.max_connection_idle_ms", int(doors.max_connection_idle_s * ms)),
            *grpc_silence_options(20.0),  # a client gone silent mid-response: 20 s
        ],
    )
    ending = asyncio.Event()
    register(_StrictMessages(server, ending))
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    port = server.add_secure_port(address, tls[1]) if tls else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind gRPC to {settings.grpc_host}:{settings.grpc_port}")
    await server.start()
    return GrpcioDoor(server, ending), port


def _priority(params: dict[str, Any]) -> int:
    """The request's `priority` parameter (tritonclient sends it as uint64_param)."""
    priority = params.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise InvalidInput("'priority' must be a non-negative integer")
    return priority


class GrpcioDoor:
    """grpcio's server as the agent stops it: streaming calls end first (their idle
    clients would otherwise hold the stop for its whole grace), then the server."""

    def __init__(self, server: grpc.aio.Server, ending: asyncio.Event) -> None:
        self._server, self._ending = server, ending

    async def stop(self, grace: float | None = None) -> None:
        self._ending.set()
        await self._server.stop(grace)
