"""The OIP v2 HTTP/REST front door, plus /metrics and /edgeplex/v1/status.

aiohttp on the agent's event loop (docs/architecture.md says why). Supports
the binary tensor data extension exactly as tritonclient.http uses it: the
JSON header's length in `Inference-Header-Content-Length`, raw tensors after
it in input order, `binary_data_size` on each binary input, and binary
outputs on request. Errors are `{"error": "..."}` with the HTTP code of the
ServeError; 429 and 503 carry Retry-After.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from ssl import SSLContext
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgeplex.agent.fleet.forward import (
    NOT_HERE,
    SEQUENCE_NOT_HERE,
    SERVED_BY,
    Forwarded,
    HttpForward,
)
from edgeplex.agent.frontdoor import openapi
from edgeplex.agent.frontdoor.auth import Access, Credentials
from edgeplex.agent.frontdoor.oip_body import (
    HEADER_LENGTH,
    InferBody,
    decode_content,
    load_json,
    parse_infer_body,
)
from edgeplex.agent.frontdoor.oip_response import TensorResponse, encode_infer_response
from edgeplex.agent.frontdoor.shared_memory import ClientRegions, cuda_not_supported
from edgeplex.agent.observability import triton_metrics
from edgeplex.agent.observability.access_log import ACCESS, REQUEST_ID, TRACEPARENT
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import (
    InvalidInput,
    NotSupported,
    Overloaded,
    ServeError,
)
from edgeplex.sizes import parse_size

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.core import Agent

log = logging.getLogger("edgeplex.agent.http")

OFFLOAD_BYTES = 1 << 20  # bodies larger than this are decoded off the event loop
SMALL_JSON = 64 * 1024  # the cap of the JSON bodies of the admin routes
# Set when the request had to wait for its model's promotion; the value names the
# tier it came from ("staged" or "cached").
COLD_START = "edgeplex-cold-start"
VARIANT = "edgeplex-variant"  # a quantized variant served it (absent: as shipped)
# What a handler answers: an aiohttp response, or (the native door's) tensor parts.
Reply = web.StreamResponse | TensorResponse
Handler = Callable[[web.Request], Awaitable[Reply]]
AioHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]  # aiohttp's door


@dataclass(frozen=True)
class Route:
    """One route as a door needs it before it reads a body: who may call it, how
    large a body it takes, and whether it passes the in-flight gate (inference)."""

    method: str
    path: str
    handler: Handler  # may raise ServeError: the door answers it; the access check is the door's
    access: Access
    what: str  # named in refusals
    max_body: int
    admits: bool


def error_response(exc: ServeError) -> web.Response:
    headers = {}
    if exc.http_status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if exc.not_here:
        headers[NOT_HERE] = "1"
    if exc.sequence_not_here:
        headers[SEQUENCE_NOT_HERE] = "1"
    return web.json_response({"error": exc.message}, status=exc.http_status, headers=headers)


def _answer_errors(handler: Handler) -> AioHandler:
    """`handler` for aiohttp's door: a ServeError answered (the native door answers
    them itself). That door's API makes no TensorResponse (`buffers` off)."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            response = await handler(request)
        except ServeError as exc:
            return error_response(exc)
        assert isinstance(response, web.StreamResponse)
        return response

    answered.__name__ = handler.__name__
    return answered


_NO_ROUTE = "/{edgeplex_no_route:.*}"


async def _no_route(request: web.Request) -> web.Response:
    """404, or 405 with Allow where another method has the path, as JSON like every
    error of the agent (aiohttp's own answers are plain text, which clients cannot
    parse)."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource.canonical != _NO_ROUTE.replace(":.*", ""):
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        headers = {"Allow": ",".join(sorted(allowed))}
        return web.json_response({"error": "405: Method Not Allowed"}, status=405, headers=headers)
    return web.json_response({"error": "404: Not Found"}, status=404)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, content_type="application/json"
    )


class HttpApi:
    def __init__(self, agent: Agent, credentials: Credentials, buffers: bool = False) -> None:
        """`buffers`: binary outputs may be answered as separate buffers (a
        TensorResponse), for a door that writes them itself."""
        self.agent = agent
        self.credentials = credentials
        self.buffers = buffers

    def table(self, max_body: int, only: str | None = None) -> list[Route]:
        """Every route, or those of the path `only`; `max_body` is the inference
        routes' body cap (the others take at most SMALL_JSON)."""
        m = "/v2/models/{model}"
        v = "/v2/models/{model}/versions/{version}"
        open_, client, admin = Access.OPEN, Access.CLIENT, Access.ADMIN
        control, local = Access.CONTROL, Access.LOCAL
        get, post = "GET", "POST"
        table = [
            (get, "/v2", self.server_metadata, open_),
            (get, "/v2/health/live", self.live, open_),
            (get, "/v2/health/ready", self.ready, open_),
            (get, "/metrics", self.metrics, open_),
            (get, "/openapi.json", self.openapi, open_),
            (get, "/v2/models/stats", self.stats, client),
            (post, "/v2/repository/index", self.repository_index, client),
            (post, "/v2/repository/models/{model}/load", self.load, control),
            (post, "/v2/repository/models/{model}/unload", self.unload, control),
            (get, "/v2/systemsharedmemory/status", self.shm_status, local),
            (get, "/v2/systemsharedmemory/region/{region}/status", self.shm_status, local),
            (post, "/v2/systemsharedmemory/region/{region}/register", self.shm_register, local),
            (post, "/v2/systemsharedmemory/unregister", self.shm_unregister, local),
            (post, "/v2/systemsharedmemory/region/{region}/unregister", self.shm_unregister, local),
            (get, "/v2/cudasharedmemory/status", self.cuda_status, local),
            (get, "/v2/cudasharedmemory/region/{region}/status", self.cuda_status, local),
            (post, "/v2/cudasharedmemory/region/{region}/register", self.cuda_register, local),
            (post, "/v2/cudasharedmemory/unregister", self.cuda_unregister, local),
            (post, "/v2/cudasharedmemory/region/{region}/unregister", self.cuda_unregister, local),
            *[
                route
                for base in (m, v)
                for route in (
                    (get, base, self.model_metadata, client),
                    (get, base + "/ready", self.model_ready, client),
                    (get, base + "/config", self.model_config, client),
                    (get, base + "/stats", self.stats, client),
                    (post, base + "/infer", self.infer, client),
                )
            ],
            (get, "/v2/logging", self.logging, client),
            (post, "/v2/logging", self.set_logging, admin),
            (get, "/v2/trace/setting", self.trace_setting, client),
            (post, "/v2/trace/setting", self.set_trace_setting, admin),
            (get, m + "/trace/setting", self.trace_setting, client),
            (post, m + "/trace/setting", self.set_trace_setting, admin),
            (get, "/edgeplex/v1/status", self.status, client),
            (get, "/edgeplex/v1/memory", self.memory, client),
            (post, "/edgeplex/v1/memory", self.set_memory, admin),
            (post, "/edgeplex/v1/models/{model}/pin", self.pin, admin),
            (post, "/edgeplex/v1/models/{model}/unpin", self.unpin, admin),
            (post, "/edgeplex/v1/models/{model}/demote", self.demote, admin),
        ]
        return [self._route(*row, max_body) for row in table if only in (None, row[1])]

    def _route(
        self, method: str, path: str, handler: Handler, access: Access, max_body: int
    ) -> Route:
        infer = handler == self.infer
        what = handler.__name__.replace("_", " ")
        cap = max_body if infer else SMALL_JSON
        return Route(method, path, handler, access, what, cap, infer)

    def routes(self, max_body: int, only: str | None = None) -> list[web.RouteDef]:
        """The table as aiohttp routes, each behind its access check."""
        return [web.route(r.method, r.path, self._checked(r)) for r in self.table(max_body, only)]

    def _checked(self, route: Route) -> AioHandler:
        """The route's handler behind its access check (one wrapper, not a middleware:
        one coroutine fewer on every request)."""
        handler = _answer_errors(route.handler)
        if route.access == Access.OPEN:
            return handler
        check = self.credentials.check
        access, what = route.access, route.what

        async def checked(request: web.Request) -> web.StreamResponse:
            try:
                check(access, request.headers.get("Authorization"), what, request.remote or "")
            except ServeError as exc:
                return error_response(exc)
            return await handler(request)

        return checked

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(self.agent.server_metadata())

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.agent.live() else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.agent.ready() else 503)

    async def model_metadata(self, request: web.Request) -> web.Response:
        if (peer := await self._asked_elsewhere(request)) is not None:
            return peer
        mi = request.match_info
        return _json(self.agent.model_metadata(mi["model"], mi.get("version", "")))

    async def model_ready(self, request: web.Request) -> web.Response:
        if (peer := await self._asked_elsewhere(request)) is not None:
            return peer
        name, version = request.match_info["model"], request.match_info.get("version", "")
        if self.agent.ensemble(name, version) is None:
            self.agent.entry(name, version)  # 404 for unknown models
        ready = self.agent.model_ready(name, version)
        return web.Response(status=200 if ready else 503)

    async def model_config(self, request: web.Request) -> web.Response:
        if (peer := await self._asked_elsewhere(request)) is not None:
            return peer
        mi = request.match_info
        return _json(self.agent.model_config(mi["model"], mi.get("version", "")))

    async def _asked_elsewhere(self, request: web.Request) -> web.Response | None:
        """A model this site does not know, but a peer holds: the peer's answer."""
        name, version = request.match_info["model"], request.match_info.get("version", "")
        reply = await self.agent.ask_http(name, version, request.path_qs, request.headers.get)
        if reply is None:
            return None
        status, body, headers = reply
        return web.Response(status=status, body=body, headers=headers)

    async def stats(self, request: web.Request) -> web.Response:
        mi = request.match_info
        return _json(
            {"model_stats": self.agent.statistics(mi.get("model", ""), mi.get("version", ""))}
        )

    async def repository_index(self, request: web.Request) -> web.Response:
        body = await request.read()
        ready_only = False
        if body.strip():
            doc = load_json(body, SMALL_JSON)
            ready_only = bool(isinstance(doc, dict) and doc.get("ready"))
        return _json(self.agent.repository_index(ready_only))

    async def load(self, request: web.Request) -> web.Response:
        """OIP load, with Triton's parameters: `config` (a model config in JSON) and
        `file:<path>` (base64 file contents)."""
        parameters = await _control_parameters(request, "load")
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            config = json.dumps(config)  # an object where Triton takes its JSON text
        files = {k: str(v).encode() for k, v in parameters.items() if k.startswith("file:")}
        await self.agent.load(request.match_info["model"], config, files)
        return web.Response(status=200)

    async def shm_status(self, request: web.Request) -> web.Response:
        return _json(self.agent.shared_memory.status(request.match_info.get("region", "")))

    async def shm_register(self, request: web.Request) -> web.Response:
        doc = load_json(await request.read(), SMALL_JSON)
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), str):
            raise InvalidInput("register: the body must be an object with 'key' and 'byte_size'")
        offset, size = doc.get("offset", 0), doc.get("byte_size")
        if not all(_integer(n) for n in (offset, size)):
            raise InvalidInput("register: 'offset' and 'byte_size' must be integers")
        name = request.match_info["region"]
        self.agent.shared_memory.register(name, doc["key"], int(offset), int(size))  # type: ignore[arg-type]
        return web.Response(status=200)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        self.agent.shared_memory.unregister(request.match_info.get("region", ""))
        return web.Response(status=200)

    async def cuda_status(self, request: web.Request) -> web.Response:
        region = request.match_info.get("region", "")
        return _json(self.agent.shared_memory.status(region, cuda=True))

    async def cuda_register(self, request: web.Request) -> web.Response:
        if reason := cuda_not_supported(self.agent.gpu):  # said first, whatever the body
            raise NotSupported(reason)
        doc = load_json(await request.read(), SMALL_JSON)
        raw = doc.get("raw_handle") if isinstance(doc, dict) else None
        handle = raw.get("b64") if isinstance(raw, dict) else None
        device, size = (doc.get("device_id", 0), doc.get("byte_size")) if raw else (None, None)
        if not isinstance(handle, str) or not all(_integer(n) for n in (device, size)):
            raise InvalidInput(
                "register: the body must be an object with 'raw_handle': {'b64': ...}, "
                "'device_id' and 'byte_size'"
            )
        try:
            decoded = base64.b64decode(handle, validate=True)
        except ValueError:
            raise InvalidInput("register: 'raw_handle' is not valid base64") from None
        name = request.match_info["region"]
        self.agent.shared_memory.register_cuda(name, decoded, int(device), int(size))  # type: ignore[arg-type]
        return web.Response(status=200)

    async def cuda_unregister(self, request: web.Request) -> web.Response:
        self.agent.shared_memory.unregister(request.match_info.get("region", ""), cuda=True)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        """OIP unload, with Triton's `unload_dependents` (an ensemble's steps too)."""
        parameters = await _control_parameters(request, "unload")
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput("unload: 'unload_dependents' must be true or false")
        await self.agent.unload(request.match_info["model"], dependents)
        return web.Response(status=200)

    async def infer(self, request: web.Request) -> Reply:
        """One inference request: held by the in-flight gate, logged, and served by
        the core's one entry point (one coroutine on the request's way)."""
        mi = request.match_info
        model, version = mi["model"], mi.get("version", "")
        headers = request.headers
        agent = self.agent
        try:
            # The native door admitted the request from its headers already.
            held = agent.gate.hold(request.content_length or 0, getattr(request, "admitted", None))
        except Overloaded:
            METRICS.refused.labels(model=agent.metric_label(model)).inc()
            raise
        access = ACCESS.start(
            "http", model, version, headers.get(TRACEPARENT), headers.get(REQUEST_ID)
        )
        try:
            raw = await request.read()
            try:
                held.grow(len(raw))
            except Overloaded:  # the gate's refusal (the core counts its own)
                METRICS.refused.labels(model=agent.metric_label(model)).inc()
                raise
            settings = agent.settings
            encoding = headers.get("Content-Encoding", "")
            split = headers.get(HEADER_LENGTH)
            decoded: list[InferBody] = []

            shared = agent.shared_memory
            regions = ClientRegions(
                shared, self.credentials, headers.get("Authorization"), request.remote or ""
            ) if shared.registered else None  # fmt: skip

            def decode_now() -> tuple[bytes, InferBody]:
                body = decode_content(raw, encoding, 2 * settings.max_payload_bytes)
                return body, parse_infer_body(
                    body, split, settings.max_json_bytes, settings.max_payload_bytes, regions
                )

            def settle(body: bytes, parsed: InferBody) -> InferBody:
                if body is not raw:
                    held.grow(len(raw) + len(body))  # the decompressed body is held as well
                decoded.append(parsed)
                return parsed

            async def decode_off_loop() -> InferBody:
                return settle(*await asyncio.to_thread(decode_now))

            def decode() -> InferBody | Coroutine[Any, Any, InferBody]:
                # Large bodies are decoded on a worker thread, so the loop keeps serving;
                # small ones at once (no coroutine per request).
                return decode_off_loop() if len(raw) > OFFLOAD_BYTES else settle(*decode_now())

            # Forwarded as received, still encoded, when the core routes it to a peer.
            forward = HttpForward(model, request.path_qs, raw, headers)
            # Whose request: the native door's check said; a fleet peer's forward names it.
            access.tenant = agent.tenants.resolve(getattr(request, "caller", ""), headers.get)
            outcome = await agent.handle(
                model, version, headers.get, forward, decode, access.forward_traceparent,
                arrived=getattr(request, "received", None),  # the native door's; aiohttp: now
                caller=access.tenant,
            )  # fmt: skip
            if isinstance(outcome, Forwarded):
                status, payload, reply_headers = outcome.reply  # type: ignore[misc]
                access.forwarded_to = reply_headers.get(SERVED_BY, "")
                access.tier = agent.tier_of(model)
                response: Reply = web.Response(status=status, body=payload, headers=reply_headers)
            else:
                result, (parsed,) = outcome, decoded
                response = encode_infer_response(
                    parsed, result.entry.name, result.entry.version, result.outputs, self.buffers
                )
                access.tier = result.cold_start or "loaded"
                if result.cold_start:
                    response.headers[COLD_START] = result.cold_start
                    access.cold_start = result.cold_start
                if result.variant:
                    response.headers[VARIANT] = result.variant
                if result.served_by:
                    response.headers[SERVED_BY] = result.served_by
        except ServeError as exc:
            access.tier = agent.tier_of(model)
            ACCESS.finish(access, exc.http_status, failed=True)
            raise
        finally:
            held.release()
        ACCESS.finish(access, response.status, failed=response.status >= 400)
        return response

    async def openapi(self, request: web.Request) -> web.Response:
        return _json(openapi.document())

    async def metrics(self, request: web.Request) -> web.Response:
        triton = triton_metrics.render(self.agent.model_counts())
        triton += triton_metrics.render_gpus(triton_metrics.gpu_readings())
        return web.Response(
            body=generate_latest(METRICS.registry) + triton.encode(),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.agent.status())

    async def memory(self, request: web.Request) -> web.Response:
        return _json(self.agent.memory())

    async def logging(self, request: web.Request) -> web.Response:
        """Triton's logging extension: the log settings."""
        return _json(self.agent.log_settings.view())

    async def set_logging(self, request: web.Request) -> web.Response:
        """Body {setting: value, ...}: the settings named change now; answers them all."""
        return _json(self.agent.log_settings.update(await _settings(request, "log")))

    async def trace_setting(self, request: web.Request) -> web.Response:
        """Triton's trace extension: the agent's trace settings, or a model's."""
        return _json(self.agent.trace_settings(request.match_info.get("model", "")))

    async def set_trace_setting(self, request: web.Request) -> web.Response:
        """Body {setting: value | [value] | null, ...}: the settings named change now
        (null: a model's goes back to the agent's); answers them all."""
        changes = await _settings(request, "trace")
        return _json(self.agent.trace_settings(request.match_info.get("model", ""), changes))

    async def set_memory(self, request: web.Request) -> web.Response:
        """Body {"device_budget": bytes | "64MiB" | null}: the loaded tier's new budget,
        applied now; answers the memory view."""
        doc = load_json(await request.read(), SMALL_JSON)
        value = doc.get("device_budget", ...) if isinstance(doc, dict) else ...
        if value is ... or isinstance(value, bool) or not isinstance(value, (int, str, type(None))):
            raise InvalidInput(
                'body must be {"device_budget": bytes, a size like "64MiB", or null}'
            )
        try:
            budget = None if value is None else parse_size(value)
        except ValueError as exc:
            raise InvalidInput(f"device_budget: {exc}") from None
        if budget is not None and budget <= 0:
            raise InvalidInput("device_budget: must be positive, or null for no limit")
        self.agent.set_device_budget(budget)
        return _json(self.agent.memory())

    async def pin(self, request: web.Request) -> web.Response:
        self.agent.pin(request.match_info["model"], True)
        return web.Response(status=200)

    async def unpin(self, request: web.Request) -> web.Response:
        self.agent.pin(request.match_info["model"], False)
        return web.Response(status=200)

    async def demote(self, request: web.Request) -> web.Response:
        """Body {"tier": "staged" | "cached"}; default staged."""
        body = await request.read()
        tier = "staged"
        if body.strip():
            doc = load_json(body, SMALL_JSON)
            if not isinstance(doc, dict) or not isinstance(doc.get("tier", "staged"), str):
                raise InvalidInput('body must be {"tier": "staged" | "cached"}')
            tier = doc.get("tier", "staged")
        await self.agent.demote(request.match_info["model"], tier)
        return web.Response(status=200)


class Stoppable(Protocol):
    async def cleanup(self) -> None: ...


async def start_http_server(
    agent: Agent,
    credentials: Credentials,
    ssl: SSLContext | None = None,
    metrics_only: bool = False,
) -> tuple[Stoppable, int]:
    """The HTTP door the settings choose (`http_server`); (what stops it, its port).
    `metrics_only`: the door of `metrics_port`, serving GET /metrics alone (as
    Triton's --metrics-port does)."""
    settings = agent.settings
    max_body = 2 * settings.max_payload_bytes + 1024 * 1024
    host, port, only = settings.http_host, settings.http_port, None
    if metrics_only:
        assert settings.metrics_port is not None
        host, port, only = settings.metrics_host, settings.metrics_port, "/metrics"
    if settings.http_server != "aiohttp":
        try:
            from edgeplex.agent.frontdoor.http_native import start_native_http
        except ImportError as exc:
            if settings.http_server == "native":
                raise RuntimeError(f"http_server: native needs httptools ({exc})") from None
        else:
            table = HttpApi(agent, credentials, buffers=True).table(max_body, only)
            return await start_native_http(
                table, credentials, agent.gate, settings.doors, host, port, ssl
            )
    app = web.Application(client_max_size=max_body)
    app.add_routes(HttpApi(agent, credentials).routes(max_body, only))
    app.router.add_route("*", _NO_ROUTE, _no_route)  # last: what no route took
    # The body is read as sent: parse_infer_body decodes Content-Encoding itself, once,
    # under its own cap, and a forwarded request keeps the encoding it came with.
    # aiohttp applies the doors' keep-alive timeout and header caps, not the rest.
    doors = settings.doors
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, auto_decompress=False,
        keepalive_timeout=doors.keepalive_timeout_s, max_headers=doors.max_headers,
        max_line_size=doors.max_header_bytes, max_field_size=doors.max_header_bytes,
    )  # fmt: skip
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    return runner, sockets[0].getsockname()[1] if sockets else port


async def _settings(request: web.Request, what: str) -> dict[str, Any]:
    """A settings change's body (Triton's logging and trace extensions): one JSON
    object of {setting: value}."""
    doc = load_json(await request.read(), SMALL_JSON)
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what} settings: the body must be a JSON object")
    return doc


async def _control_parameters(request: web.Request, verb: str) -> dict[str, Any]:
    """A load's or unload's `parameters` (an empty body has none)."""
    body = await request.read()
    if not body.strip():
        return {}
    doc = load_json(body, SMALL_JSON)
    found = doc.get("parameters") if isinstance(doc, dict) else None
    if found is not None and not isinstance(found, dict):
        raise InvalidInput(f"{verb}: 'parameters' must be a JSON object")
    return found or {}
