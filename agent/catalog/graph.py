"""A model's inputs and outputs, read from its ONNX file without loading it.

The agent validates a request before it promotes a model, so the interface of
every model must be known while the model is only staged or cached. This
reads the graph's `input`, `output` and `initializer` names straight from the
protobuf wire format over an mmap of the file: the nodes and the weights are
skipped by length, never copied or parsed, so a 2 GB model costs a few page
faults. No `onnx` package is needed at run time.

`read_external_weights` reads, the same way, where a staged copy's weights lie
in its weights file, so a runner can hand them to ONNX Runtime from a mapping
it keeps (runners/staged_weights.py). `weights_as_inputs` rewrites a staged
graph so that those weights become graph inputs: the weightless graph that is
left is the same for every model of one architecture, and one session of it
serves them all, each run fed its model's weights (runners/shared_graphs.py).

Pure functions; all raise GraphError for anything that is not a readable
ONNX model (the load would fail anyway, with ORT's own message).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from edgeplex.agent.oip.tensors import TensorSpec

# TensorProto.DataType -> OIP datatype (onnx.proto3).
ONNX_TO_OIP = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
    16: "BF16",
}

# Field numbers (onnx.proto3).
_MODEL_IR_VERSION, _MODEL_GRAPH = 1, 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT, _GRAPH_SPARSE = 5, 11, 12, 15
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME = 1, 2, 8
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION, _LOCATION_EXTERNAL = 13, 14, 1
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_SPARSE_VALUES = 1
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TENSOR_ELEM, _TENSOR_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE = 1


T = TypeVar("T")


class GraphError(Exception):
    """The file is not an ONNX model this reader understands."""


@dataclass(frozen=True, slots=True)
class Interface:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Graph inputs that an initializer gives a default (IR version 4 on): a request
    # may leave them out (ONNX Runtime's overridable initializers).
    defaulted: tuple[TensorSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class ExternalWeight:
    """An initializer whose bytes lie in another file: `length` bytes at `offset`."""

    name: str
    data_type: int  # TensorProto.DataType
    dims: tuple[int, ...]
    location: str
    offset: int
    length: int


def read_interface(path: Path) -> Interface:
    return _read(path, _interface)


def read_external_weights(path: Path) -> list[ExternalWeight]:
    """Every initializer of the graph that keeps its bytes in an external file."""
    return _read(path, lambda model: _external_weights(_graph_of(model)))


def weights_as_inputs(path: Path, weights: list[ExternalWeight]) -> bytes:
    """The model at `path` with its initializers named in `weights` taken out of the
    graph and declared as graph inputs of their type and shape instead: a graph that
    holds no external weights, so a session of it can be fed any weights of that
    shape. Every other field is copied byte for byte. Raises GraphError for a graph
    that already lists one of them as an input (a weight a caller may override)."""
    names = {w.name for w in weights}
    model = memoryview(path.read_bytes())
    out = bytearray()
    for field, _, value, start, end in _spans(model):
        if field != _MODEL_GRAPH or not isinstance(value, memoryview):
            out += model[start:end]
            continue
        rewritten = bytearray()
        for f, _, v, s, e in _spans(value):
            if isinstance(v, memoryview) and f in (_GRAPH_INPUT, _GRAPH_INITIALIZER):
                name = _string(v, _VALUE_NAME if f == _GRAPH_INPUT else _TENSOR_NAME)
                if name in names and f == _GRAPH_INPUT:
                    raise GraphError(f"weight '{name}' is also a graph input")
                if name in names:
                    continue  # the initializer, now an input
            rewritten += value[s:e]
        for w in weights:
            shape = b"".join(_bytes_field(_SHAPE_DIM, _int_field(_DIM_VALUE, d)) for d in w.dims)
            tensor = _int_field(_TENSOR_ELEM, w.data_type) + _bytes_field(_TENSOR_SHAPE, shape)
            info = _bytes_field(_VALUE_NAME, w.name.encode()) + _bytes_field(
                _VALUE_TYPE, _bytes_field(_TYPE_TENSOR, tensor)
            )
            rewritten += _bytes_field(_GRAPH_INPUT, info)
        out += _bytes_field(_MODEL_GRAPH, bytes(rewritten))
    return bytes(out)


def _read(path: Path, read_model: Callable[[memoryview], T]) -> T:
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                return read_model(view)
            finally:
                view.release()
    except (OSError, ValueError) as exc:
        raise GraphError(f"cannot read the model file: {exc.__class__.__name__}") from None


def _graph_of(buf: memoryview) -> memoryview:
    for field, _, value in _fields(buf):
        if field == _MODEL_GRAPH and isinstance(value, memoryview):
            return value
    raise GraphError("the file holds no ONNX graph")


def _external_weights(buf: memoryview) -> list[ExternalWeight]:
    weights = []
    for field, _, value in _fields(buf):
        if field != _GRAPH_INITIALIZER or not isinstance(value, memoryview):
            continue
        name, data_type, dims, where, external = "", 0, [], {}, False
        for f, wire, v in _fields(value):
            if f == _TENSOR_NAME and isinstance(v, memoryview):
                name = bytes(v).decode("utf-8", "replace")
            elif f == _TENSOR_TYPE and isinstance(v, int):
                data_type = v
            elif f == _TENSOR_DIMS and isinstance(v, memoryview):  # packed
                pos = 0
                while pos < len(v):
                    dim, pos = _varint(v, pos)
                    dims.append(dim)
            elif f == _TENSOR_DIMS and wire == 0 and isinstance(v, int):
                dims.append(v)
            elif f == _TENSOR_EXTERNAL_DATA and isinstance(v, memoryview):
                where[_string(v, _ENTRY_KEY)] = _string(v, _ENTRY_VALUE)
            elif f == _TENSOR_DATA_LOCATION and isinstance(v, int):
                external = v == _LOCATION_EXTERNAL
        if external:
            try:
                offset, length = int(where.get("offset", 0)), int(where["length"])
            except (KeyError, ValueError):
                raise GraphError(f"initializer '{name}': no usable external length") from None
            weights.append(
                ExternalWeight(
                    name, data_type, tuple(dims), where.get("location", ""), offset, length
                )
            )
    return weights


def _interface(model: memoryview) -> Interface:
    ir_version = next(
        (v for f, _, v in _fields(model) if f == _MODEL_IR_VERSION and isinstance(v, int)), 0
    )
    inputs, outputs, weights = [], [], set()
    for field, _, value in _fields(_graph_of(model)):
        if not isinstance(value, memoryview):
            continue
        if field == _GRAPH_INPUT:
            inputs.append(_value_info(value))
        elif field == _GRAPH_OUTPUT:
            outputs.append(_value_info(value))
        elif field == _GRAPH_INITIALIZER:
            weights.add(_string(value, _TENSOR_NAME))
        elif field == _GRAPH_SPARSE:
            for f, _, v in _fields(value):
                if f == _SPARSE_VALUES and isinstance(v, memoryview):
                    weights.add(_string(v, _TENSOR_NAME))
    # Before IR version 4, weights were also listed as graph inputs, and fixed.
    return Interface(
        tuple(s for s in inputs if s.name not in weights),
        tuple(outputs),
        tuple(s for s in inputs if s.name in weights) if ir_version >= 4 else (),
    )


def _value_info(buf: memoryview) -> TensorSpec:
    name, datatype = "", ""
    shape: tuple[int, ...] = ()
    for field, _, value in _fields(buf):
        if field == _VALUE_NAME and isinstance(value, memoryview):
            name = bytes(value).decode("utf-8", "replace")
        elif field == _VALUE_TYPE and isinstance(value, memoryview):
            for f, _, v in _fields(value):
                if f == _TYPE_TENSOR and isinstance(v, memoryview):
                    datatype, shape = _tensor_type(v)
    return TensorSpec(name, datatype or "UNSUPPORTED", shape)


def _tensor_type(buf: memoryview) -> tuple[str, tuple[int, ...]]:
    datatype, dims = "", []
    for field, _, value in _fields(buf):
        if field == _TENSOR_ELEM and isinstance(value, int):
            datatype = ONNX_TO_OIP.get(value, f"ONNX_TYPE_{value}")
        elif field == _TENSOR_SHAPE and isinstance(value, memoryview):
            for f, _, dim in _fields(value):
                if f == _SHAPE_DIM and isinstance(dim, memoryview):
                    dims.append(_dim(dim))
    return datatype, tuple(dims)


def _dim(buf: memoryview) -> int:
    for field, _, value in _fields(buf):
        if field == _DIM_VALUE and isinstance(value, int) and value > 0:
            return value
    return -1  # a symbolic or unknown dimension


def _string(buf: memoryview, wanted: int) -> str:
    for field, _, value in _fields(buf):
        if field == wanted and isinstance(value, memoryview):
            return bytes(value).decode("utf-8", "replace")
    return ""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise GraphError("truncated or corrupt protobuf")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview):  # type: ignore[no-untyped-def]
    """(field number, wire type, value) of each field: ints for varints and fixed
    widths, memoryviews (no copy) for length-delimited fields."""
    for field, wire, value, _, _ in _spans(buf):
        yield field, wire, value


def _spans(buf: memoryview):  # type: ignore[no-untyped-def]
    """As _fields, plus where each field's bytes (key included) start and end."""
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, wire, value, start, pos
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise GraphError("truncated or corrupt protobuf")
            yield field, wire, buf[pos : pos + size], start, pos + size
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise GraphError("truncated or corrupt protobuf")
            yield field, wire, 0, start, pos
        else:
            raise GraphError(f"unexpected protobuf wire type {wire}")


def _encoded_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int_field(field: int, value: int) -> bytes:
    return _encoded_varint(field << 3) + _encoded_varint(value)


def _bytes_field(field: int, value: bytes) -> bytes:
    return _encoded_varint(field << 3 | 2) + _encoded_varint(len(value)) + value
