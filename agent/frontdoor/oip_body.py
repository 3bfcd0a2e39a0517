"""Decoding an OIP v2 HTTP inference request body, strictly.

Pure functions, no I/O. Whatever a client sends, the result is an `InferBody`
or an `InvalidInput` naming the fault: the content encoding is decoded once
(aiohttp is told not to), the JSON part has its own size cap, well below the
binary one, and a nesting limit checked before it is parsed; every field is
type-checked; a tensor's shape is checked against the payload cap before
anything is allocated for it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from edgeplex.agent.batching.sequences import Flags, flags_of
from edgeplex.agent.frontdoor.inflate import ENCODINGS, Corrupt, TooLarge, inflate
from edgeplex.agent.frontdoor.shared_memory import ClientRegions, Ref, ref_of
from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.requests import InferInput
from edgeplex.agent.oip.tensors import check_payload_cap, from_list, from_raw

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_JSON_DEPTH = 32  # object/array nesting; a tensor of rank 8 in a request needs 12
# Every byte but the ones that make JSON's structure: quotes and brackets.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')


@dataclass
class InferBody:
    """What an infer request asks for, decoded and checked."""

    inputs: list[InferInput]
    outputs: list[str] | None = None  # None: every output
    binary_outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False
    request_id: str | None = None
    timeout_s: float | None = None
    deadline_s: float | None = None  # a transport's deadline: HTTP has none
    priority: int = 0  # the `priority` parameter (0: none)
    # Outputs to write into shared memory, and the regions as this client may use them.
    shm_outputs: dict[str, Ref] = field(default_factory=dict)
    regions: ClientRegions | None = None
    sequence: Flags | None = None  # a stateful model's request: its sequence and place
    classify: dict[str, int] = field(default_factory=dict)  # output: top k (classification)


def decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo `Content-Encoding` once (identity, gzip, deflate), never past `limit`."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ENCODINGS:
        raise InvalidInput(f"unsupported Content-Encoding '{encoding}' (gzip, deflate)")
    try:
        return inflate(body, encoding, limit)
    except TooLarge:
        raise InvalidInput(f"the decompressed request exceeds the {limit}-byte cap") from None
    except Corrupt as exc:
        raise InvalidInput(f"body is {exc}") from None


def json_depth(text: bytes) -> int:
    """Deepest nesting of arrays and objects in `text` (brackets inside strings do not
    count), found without parsing and in time linear in its length whatever it holds:
    a few bytes-level passes in C (escapes dropped, then all but quotes and brackets)
    and one vectorised prefix sum; 1 MiB of any shape costs about 10 ms. Invalid JSON
    gets some depth; the parser refuses it next."""
    if text.count(b"[") + text.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper than the limit
    # An escaped backslash, then an escaped quote, as JSON pairs them from the left.
    text = bytes(text).replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = np.frombuffer(text.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    quote = marks == ord('"')
    outside = (np.cumsum(quote, dtype=np.uint8) & 1) == 0  # parity survives wrapping
    opens = ((marks == ord("[")) | (marks == ord("{"))).view(np.int8)
    closes = ((marks == ord("]")) | (marks == ord("}"))).view(np.int8)
    steps = (opens - closes) * outside
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def load_json(text: bytes, cap: int, what: str = "request JSON") -> Any:
    if len(text) > cap:
        raise InvalidInput(f"the {what} is {len(text)} bytes; the cap is {cap}")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InvalidInput(f"the {what} nests {depth} levels deep; the limit is {MAX_JSON_DEPTH}")
    try:
        return orjson.loads(text)  # several times the standard library's speed
    except orjson.JSONDecodeError:
        pass  # what orjson refuses and Python accepts (NaN), or the error, below
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be an object")
    return value


def _huge(value: float) -> bool:
    """A finite float past 64 bits: an integer as orjson reads it (Infinity and NaN,
    which only the fallback parser reads, stay floats and are refused as such)."""
    return math.isfinite(value) and abs(value) >= 2**63


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _outputs(doc: dict[str, Any], body: InferBody) -> None:
    outputs = doc.get("outputs")
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise InvalidInput("'outputs' must be a list")
    names = []
    for item in outputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name'")
        params = _object(item.get("parameters"), f"output '{item['name']}': 'parameters'")
        ref = ref_of(params, item["name"]) if params else None
        if ref is not None:
            body.shm_outputs[item["name"]] = ref
        binary = params.get("binary_data")
        if binary is not None:
            if not isinstance(binary, bool):
                raise InvalidInput(f"output '{item['name']}': 'binary_data' must be true or false")
            body.binary_outputs[item["name"]] = binary
        count = params.get("classification")
        if count is not None:
            if not _int(count) or count < 0:
                raise InvalidInput(
                    f"output '{item['name']}': 'classification' must be a non-negative integer"
                )
            if count:
                body.classify[item["name"]] = count
        names.append(item["name"])
    body.outputs = names or None


def _parameters(doc: dict[str, Any], body: InferBody) -> None:
    params = _object(doc.get("parameters"), "'parameters'")
    binary = params.get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise InvalidInput("'binary_data_output' must be true or false")
    body.binary_default = binary
    timeout = params.get("timeout")
    if timeout is not None:
        if not _int(timeout) or timeout < 0:
            raise InvalidInput("'timeout' must be a non-negative integer (microseconds)")
        body.timeout_s = timeout / 1e6 if timeout else None
    priority = params.get("priority")
    if priority is not None:
        if not _int(priority) or priority < 0:
            raise InvalidInput("'priority' must be a non-negative integer")
        body.priority = priority
    if params:
        body.sequence = flags_of(params)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    body.request_id = request_id


def parse_infer_body(
    body: bytes,
    header_length: str | None,
    json_cap: int,
    payload_cap: int,
    regions: ClientRegions | None = None,
) -> InferBody:
    """Split the JSON header from the binary tensors and decode every input (from
    shared memory where its parameters name a region: `regions`)."""
    if header_length is not None:
        try:
            split = int(header_length.strip())
        except ValueError:
            raise InvalidInput(f"{HEADER_LENGTH} is not an integer") from None
        if not 0 <= split <= len(body):
            raise InvalidInput(f"{HEADER_LENGTH} {split} is outside the body")
    else:
        split = len(body)
    doc = load_json(body[:split], json_cap)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise InvalidInput("request JSON must be an object with an 'inputs' list")
    binary = memoryview(body)[split:]
    offset = total = 0
    inputs = []
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise InvalidInput("each input must be an object")
        name, shape, datatype = item.get("name"), item.get("shape"), item.get("datatype")
        if not isinstance(name, str):
            raise InvalidInput("an input has no 'name'")
        if isinstance(shape, list):  # orjson reads integers past 64 bits as floats
            shape = [int(d) if isinstance(d, float) and _huge(d) else d for d in shape]
        if not isinstance(shape, list) or not all(_int(d) for d in shape):
            raise InvalidInput(f"input '{name}': 'shape' must be a list of integers")
        if not isinstance(datatype, str):
            raise InvalidInput(f"input '{name}': 'datatype' must be a string")
        params = _object(item.get("parameters"), f"input '{name}': 'parameters'")
        size = params.get("binary_data_size")
        ref = ref_of(params, name) if params else None
        if ref is not None:
            if regions is None:
                raise InvalidInput(
                    f"input '{name}': Unable to find system shared memory region: '{ref.region}'"
                )
            total += ref.byte_size
            check_payload_cap(name, total, payload_cap)
            array = from_raw(name, datatype, shape, regions.read(ref, name), payload_cap)
        elif size is not None:
            if not _int(size) or size < 0 or offset + size > len(binary):
                raise InvalidInput(f"input '{name}': binary_data_size {size} exceeds the body")
            total += size
            check_payload_cap(name, total, payload_cap)
            array = from_raw(name, datatype, shape, binary[offset : offset + size], payload_cap)
            offset += size
        elif "data" in item:
            array = from_list(name, datatype, shape, item["data"], payload_cap)
            total += array.nbytes
            check_payload_cap(name, total, payload_cap)
        else:
            raise InvalidInput(f"input '{name}' has neither 'data' nor binary_data_size")
        inputs.append(InferInput(name, datatype, shape, array))
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data match no input")
    parsed = InferBody(inputs, regions=regions)
    _outputs(doc, parsed)
    if parsed.shm_outputs and regions is None:
        name, ref = next(iter(parsed.shm_outputs.items()))
        raise InvalidInput(
            f"output '{name}': Unable to find system shared memory region: '{ref.region}'"
        )
    _parameters(doc, parsed)
    return parsed
