"""The agent's HTTP API as an OpenAPI 3.0 document, served at /openapi.json.

The Open Inference Protocol v2 paths plus edgeplex's own. The suite checks
the live agent against it with schemathesis (tests/agent/frontdoor/test_openapi.py).
"""

from __future__ import annotations

from typing import Any

from edgeplex import __version__

_ERROR = {
    "description": "A client error or refusal, naming what is wrong",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}}
        }
    },
}
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32"]
DATATYPES += ["INT64", "FP16", "FP32", "FP64"]
_NAME = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": DATATYPES},
        "parameters": {"type": "object"},
        "data": {"type": "array"},
    },
}
_INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "properties": {
                "timeout": {"type": "integer", "minimum": 0, "description": "microseconds"},
                "binary_data_output": {"type": "boolean"},
            },
        },
        "inputs": {"type": "array", "items": _TENSOR},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
            },
        },
    },
}
_JSON_OK = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
_STATUS = {"description": "OK (200) or not (503)"}
_ADMIN: list[dict[str, list[str]]] = [{"bearer": []}]


def _op(summary: str, params: list[dict[str, Any]], ok: dict[str, Any], **extra: Any) -> Any:
    responses = {"200": ok, "400": _ERROR, "401": _ERROR, "404": _ERROR, "503": _ERROR}
    return {"summary": summary, "parameters": params, "responses": responses, **extra}


def _trace_setting(what: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    setting = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    body = {"type": "object", "additionalProperties": {**setting, "nullable": True}}
    return {
        "get": _op(what, parameters, _JSON_OK),
        "post": _op(
            f"change {what}: {{setting: value | [value] | null, ...}}",
            parameters,
            _JSON_OK,
            security=_ADMIN,
            requestBody={"content": {"application/json": {"schema": body}}},
        ),
    }


def _model_paths(base: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    infer_body = {
        "required": True,
        "content": {"application/json": {"schema": _INFER_REQUEST}},
    }
    return {
        base: {"get": _op("model metadata", params, _JSON_OK)},
        f"{base}/ready": {"get": _op("model readiness", params, _STATUS)},
        f"{base}/config": {"get": _op("model configuration", params, _JSON_OK)},
        f"{base}/stats": {"get": _op("model statistics", params, _JSON_OK)},
        f"{base}/infer": {
            "post": _op(
                "inference (JSON; binary tensors with Inference-Header-Content-Length)",
                params,
                _JSON_OK,
                requestBody=infer_body,
            )
        },
    }


def document() -> dict[str, Any]:
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    verb = {"post": _op("", [_NAME], {"description": "done"}, security=_ADMIN)}
    demote = {
        "post": _op(
            "demote to the staged or cached tier once admitted requests are answered",
            [_NAME],
            {"description": "done"},
            security=_ADMIN,
            requestBody={
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "tier": {"type": "string", "enum": ["staged", "cached"]}
                            },
                        }
                    }
                }
            },
        )
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "edgeplex agent", "version": __version__},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/v2": {"get": _op("server metadata", [], _JSON_OK)},
            "/v2/health/live": {"get": _op("liveness", [], _STATUS)},
            "/v2/health/ready": {"get": _op("readiness", [], _STATUS)},
            "/v2/models/stats": {"get": _op("statistics of every model", [], _JSON_OK)},
            "/v2/repository/index": {
                "post": _op(
                    "repository index",
                    [],
                    {"description": "OK", "content": {"application/json": {"schema": {}}}},
                    requestBody={
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"ready": {"type": "boolean"}},
                                }
                            }
                        }
                    },
                )
            },
            "/v2/repository/models/{model}/load": verb,
            "/v2/repository/models/{model}/unload": verb,
            **_model_paths(model, [_NAME]),
            **_model_paths(versioned, [_NAME, _VERSION]),
            "/v2/logging": {
                "get": _op("log settings", [], _JSON_OK),
                "post": _op(
                    "change log settings: {setting: value, ...}",
                    [],
                    _JSON_OK,
                    security=_ADMIN,
                    requestBody={"content": {"application/json": {"schema": {"type": "object"}}}},
                ),
            },
            "/v2/trace/setting": _trace_setting("the agent's trace settings", []),
            "/v2/models/{model}/trace/setting": _trace_setting("a model's trace settings", [_NAME]),
            "/edgeplex/v1/status": {"get": _op("every model's state", [], _JSON_OK)},
            "/edgeplex/v1/memory": {
                "get": _op("bytes per tier", [], _JSON_OK),
                "post": _op(
                    'a new device budget, now: {"device_budget": bytes | "64MiB" | null}',
                    [],
                    _JSON_OK,
                ),
            },
            "/edgeplex/v1/models/{model}/pin": verb,
            "/edgeplex/v1/models/{model}/unpin": verb,
            "/edgeplex/v1/models/{model}/demote": demote,
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "OK"}},
                }
            },
        },
    }
