"""An OIP v2 inference response over HTTP: the JSON body, or with binary
outputs the JSON header followed by the raw tensors (`Inference-Header-
Content-Length` says where the header ends).

Binary outputs are not copied into one body when the door writes buffers
itself (the native door): a `TensorResponse` keeps the header and a view of
each output array, and the door hands them to the transport in one
`writelines` (one writev under uvloop). An image-sized output is then copied
once, by the kernel, instead of three times (into bytes, into the joined
body, and behind the status line).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from edgeplex.agent.frontdoor.oip_body import HEADER_LENGTH, InferBody
from edgeplex.agent.frontdoor.shared_memory import BYTE_SIZE, OFFSET, REGION
from edgeplex.agent.oip.tensors import oip_datatype, raw_view, text_values

Buffer = bytes | memoryview


class TensorResponse:
    """A 200 response whose body is `parts`, written as they are by a door that
    writes buffers itself (aiohttp's door gets a plain `web.Response` instead).
    Not an aiohttp response: the door reads only these fields, and building one of
    aiohttp's cost more than the rest of the encoding."""

    __slots__ = ("body_bytes", "headers", "parts")
    status = 200
    reason = "OK"
    content_type = "application/octet-stream"

    def __init__(self, parts: list[Buffer], header_bytes: int) -> None:
        self.headers = {"Content-Type": self.content_type, HEADER_LENGTH: str(header_bytes)}
        self.parts = parts
        self.body_bytes = sum(len(p) for p in parts)  # bytes, or uint8 views


def json_values(array: np.ndarray) -> np.ndarray | None:
    """A tensor's values for a JSON body, flat, for orjson to write itself; floats
    as float64, so the text is Python's shortest repr, as json.dumps writes it.
    None when a float is NaN or infinite: orjson would write null, so the body
    goes through json.dumps, which writes NaN and Infinity as before."""
    flat = array.reshape(-1)
    if flat.dtype.kind == "f":
        if not np.isfinite(flat).all():
            return None
        flat = flat.astype(np.float64)
    return np.ascontiguousarray(flat)


def encode_infer_response(
    body: InferBody,
    model: str,
    version: str,
    outputs: dict[str, np.ndarray],
    buffers: bool = False,
) -> web.Response | TensorResponse:
    """The response to `body`; with `buffers`, binary outputs come as a TensorResponse."""
    items = []
    blobs: list[Buffer] = []
    standard = False  # a value orjson would write differently: json.dumps writes the body
    for name, array in outputs.items():
        item: dict[str, Any] = {
            "name": name,
            "datatype": oip_datatype(array),
            "shape": list(array.shape),
        }
        ref = body.shm_outputs.get(name) if body.shm_outputs else None
        if ref is not None and body.regions is not None:  # written where the client said
            blob = raw_view(array)
            body.regions.write(ref, name, memoryview(blob))
            item["parameters"] = {REGION: ref.region, BYTE_SIZE: len(blob)}
            if ref.offset:
                item["parameters"][OFFSET] = ref.offset
        elif body.binary_outputs.get(name, body.binary_default):
            blob = raw_view(array)  # no copy: joined once below, or written as it is
            item["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif array.dtype == object:
            item["data"] = text_values(array)
        else:
            values = json_values(array)
            standard = standard or values is None
            item["data"] = array.reshape(-1).tolist() if values is None else values
        items.append(item)
    response: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": items}
    if body.request_id is not None:
        response["id"] = body.request_id
    if standard:
        header = json.dumps(response, default=lambda a: a.tolist()).encode()
    else:  # several times json.dumps's speed, numeric arrays written without lists
        header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return web.Response(body=header, content_type="application/json")
    if buffers:
        return TensorResponse([header, *blobs], len(header))
    return web.Response(
        body=b"".join([header, *blobs]),
        headers={HEADER_LENGTH: str(len(header))},
        content_type="application/octet-stream",
    )
