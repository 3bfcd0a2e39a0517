"""The OIP v2 HTTP/REST front door, plus /metrics and /edgeplex/v1/status.

aiohttp on the agent's event loop (docs/architecture.md says why). Supports
the binary tensor data extension exactly as tritonclient.http uses it: the
JSON header's length in `Inference-Header-Content-Length`, raw tensors after
it in input order, `binary_data_size` on each binary input, and binary
outputs on request. Errors are `{"error": "..."}` with the HTTP code of the
ServeError; 429 and 503 carry Retry-After.
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgeplex.agent.core import Agent
from edgeplex.agent.errors import InvalidInput, ServeError
from edgeplex.agent.fleet.forward import FORWARDED, ORIGIN_REGION, SERVED_BY
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.requests import InferInput
from edgeplex.agent.tensors import (
    check_payload_cap,
    from_list,
    from_raw,
    oip_datatype,
    to_raw,
)
from edgeplex.names import valid_name

log = logging.getLogger("edgeplex.agent.http")

HEADER_LENGTH = "Inference-Header-Content-Length"
# Set when the request had to wait for its model's promotion; the value names the
# tier it came from ("staged" or "cached").
COLD_START = "edgeplex-cold-start"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: ServeError) -> web.Response:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return web.json_response({"error": exc.message}, status=exc.http_status, headers=headers)


@web.middleware
async def serve_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServeError as exc:
        return error_response(exc)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, content_type="application/json"
    )


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidInput(f"unsupported Content-Encoding '{encoding}'")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise InvalidInput(f"the decompressed request exceeds the {limit}-byte payload cap")
    return out


def parse_infer_body(
    body: bytes, header_length: str | None, cap: int
) -> tuple[dict[str, Any], list[InferInput]]:
    """Split the JSON header from the binary tensors and decode every input."""
    if header_length is not None:
        try:
            split = int(header_length)
        except ValueError:
            raise InvalidInput(f"{HEADER_LENGTH} is not an integer") from None
        if not 0 <= split <= len(body):
            raise InvalidInput(f"{HEADER_LENGTH} {split} is outside the body")
    else:
        split = len(body)
    try:
        doc = json.loads(body[:split])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise InvalidInput("request JSON must be an object with an 'inputs' list")
    binary = memoryview(body)[split:]
    offset = 0
    total = 0
    inputs = []
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise InvalidInput("each input must be an object")
        name = item.get("name")
        shape = item.get("shape")
        datatype = item.get("datatype")
        if not isinstance(name, str):
            raise InvalidInput("an input has no 'name'")
        if (
            not isinstance(shape, list)
            or not all(isinstance(d, int) for d in shape)
            or not isinstance(datatype, str)
        ):
            raise InvalidInput(f"input '{name}': 'shape' (integers) and 'datatype' are required")
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise InvalidInput(f"input '{name}': binary_data_size {size} exceeds the body")
            total += size
            check_payload_cap(name, total, cap)
            array = from_raw(name, datatype, shape, binary[offset : offset + size])
            offset += size
        elif "data" in item:
            array = from_list(name, datatype, shape, item["data"])
            total += array.nbytes
            check_payload_cap(name, total, cap)
        else:
            raise InvalidInput(f"input '{name}' has neither 'data' nor binary_data_size")
        inputs.append(InferInput(name, datatype, shape, array))
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data match no input")
    return doc, inputs


def encode_infer_response(
    doc: dict[str, Any], model: str, version: str, outputs: dict[str, np.ndarray]
) -> web.Response:
    requested = {}
    for out in doc.get("outputs") or []:
        if isinstance(out, dict) and isinstance(out.get("name"), str):
            requested[out["name"]] = (out.get("parameters") or {}).get("binary_data")
    default_binary = bool((doc.get("parameters") or {}).get("binary_data_output", False))
    items = []
    blobs = []
    for name, array in outputs.items():
        item: dict[str, Any] = {
            "name": name,
            "datatype": oip_datatype(array),
            "shape": list(array.shape),
        }
        binary = requested.get(name)
        if binary is None:
            binary = default_binary
        if binary:
            blob = to_raw(array)
            item["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            item["data"] = array.reshape(-1).tolist()
        items.append(item)
    response: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": items}
    if "id" in doc:
        response["id"] = doc["id"]
    header = json.dumps(response).encode()
    if not blobs:
        return web.Response(body=header, content_type="application/json")
    return web.Response(
        body=b"".join([header, *blobs]),
        headers={HEADER_LENGTH: str(len(header))},
        content_type="application/octet-stream",
    )


class HttpApi:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def routes(self) -> list[web.RouteDef]:
        m = "/v2/models/{model}"
        v = "/v2/models/{model}/versions/{version}"
        return [
            web.get("/v2", self.server_metadata),
            web.get("/v2/health/live", self.live),
            web.get("/v2/health/ready", self.ready),
            web.get("/v2/models/stats", self.stats),
            web.post("/v2/repository/index", self.repository_index),
            web.post("/v2/repository/models/{model}/load", self.load),
            web.post("/v2/repository/models/{model}/unload", self.unload),
            *[
                r
                for base in (m, v)
                for r in (
                    web.get(base, self.model_metadata),
                    web.get(base + "/ready", self.model_ready),
                    web.get(base + "/config", self.model_config),
                    web.get(base + "/stats", self.stats),
                    web.post(base + "/infer", self.infer),
                )
            ],
            web.get("/metrics", self.metrics),
            web.get("/edgeplex/v1/status", self.status),
            web.get("/edgeplex/v1/memory", self.memory),
            web.post("/edgeplex/v1/models/{model}/pin", self.pin),
            web.post("/edgeplex/v1/models/{model}/unpin", self.unpin),
            web.post("/edgeplex/v1/models/{model}/demote", self.demote),
        ]

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(self.agent.server_metadata())

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.agent.live() else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.agent.ready() else 503)

    async def model_metadata(self, request: web.Request) -> web.Response:
        mi = request.match_info
        return _json(self.agent.model_metadata(mi["model"], mi.get("version", "")))

    async def model_ready(self, request: web.Request) -> web.Response:
        mi = request.match_info
        self.agent.entry(mi["model"], mi.get("version", ""))  # 404 for unknown models
        ready = self.agent.model_ready(mi["model"], mi.get("version", ""))
        return web.Response(status=200 if ready else 503)

    async def model_config(self, request: web.Request) -> web.Response:
        mi = request.match_info
        return _json(self.agent.model_config(mi["model"], mi.get("version", "")))

    async def stats(self, request: web.Request) -> web.Response:
        mi = request.match_info
        return _json(
            {"model_stats": self.agent.statistics(mi.get("model", ""), mi.get("version", ""))}
        )

    async def repository_index(self, request: web.Request) -> web.Response:
        body = await request.read()
        ready_only = False
        if body.strip():
            try:
                doc = json.loads(body)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"request body is not valid JSON: {exc}") from None
            ready_only = bool(isinstance(doc, dict) and doc.get("ready"))
        return _json(self.agent.repository_index(ready_only))

    async def load(self, request: web.Request) -> web.Response:
        await self.agent.load(request.match_info["model"])
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        await self.agent.unload(request.match_info["model"])
        return web.Response(status=200)

    async def infer(self, request: web.Request) -> web.Response:
        mi = request.match_info
        origin = request.headers.get(ORIGIN_REGION, "")
        origin = origin if valid_name(origin) else ""
        router = self.agent.router
        peers = self.agent.route(mi["model"], FORWARDED in request.headers, origin)
        if peers and router is not None:
            status, payload, headers = await router.forward_http(
                request.path_qs, await request.read(), dict(request.headers), peers, origin
            )
            return web.Response(status=status, body=payload, headers=headers)
        cap = self.agent.settings.max_payload_bytes
        body = _decompress(
            await request.read(), request.headers.get("Content-Encoding", "").lower(), 2 * cap
        )
        doc, inputs = parse_infer_body(body, request.headers.get(HEADER_LENGTH), cap)
        wanted = [
            o["name"]
            for o in doc.get("outputs") or []
            if isinstance(o, dict) and isinstance(o.get("name"), str)
        ] or None
        timeout_s = None
        params = doc.get("parameters")
        if isinstance(params, dict) and isinstance(params.get("timeout"), int):
            timeout_s = params["timeout"] / 1e6
        result = await self.agent.infer(
            mi["model"], mi.get("version", ""), inputs, wanted, timeout_s, origin
        )
        response = encode_infer_response(
            doc, result.entry.name, result.entry.version, result.outputs
        )
        if result.cold_start:
            response.headers[COLD_START] = result.cold_start
        if router is not None:
            response.headers[SERVED_BY] = router.site_id
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(METRICS.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.agent.status())

    async def memory(self, request: web.Request) -> web.Response:
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
            try:
                doc = json.loads(body)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"request body is not valid JSON: {exc}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("tier", "staged"), str):
                raise InvalidInput('body must be {"tier": "staged" | "cached"}')
            tier = doc.get("tier", "staged")
        await self.agent.demote(request.match_info["model"], tier)
        return web.Response(status=200)


async def start_http_server(agent: Agent) -> tuple[web.AppRunner, int]:
    settings = agent.settings
    app = web.Application(
        middlewares=[serve_errors], client_max_size=2 * settings.max_payload_bytes + 1024 * 1024
    )
    app.add_routes(HttpApi(agent).routes())
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.http_host, settings.http_port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    port = sockets[0].getsockname()[1] if sockets else settings.http_port
    return runner, port
