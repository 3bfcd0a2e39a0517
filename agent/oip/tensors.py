"""Open Inference Protocol datatypes and tensor (de)coding.

Pure functions, no I/O: the front doors call them to turn wire tensors into
numpy arrays and back. Every error is an InvalidInput naming the tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from edgeplex.agent.oip.errors import InvalidInput

# OIP datatype -> numpy dtype (little-endian, as the protocol requires).
OIP_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
NUMPY_TO_OIP: dict[np.dtype, str] = {v: k for k, v in OIP_TO_NUMPY.items()}

# ONNX Runtime's type strings (NodeArg.type) -> OIP datatype.
ORT_TO_OIP: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
    "tensor(bfloat16)": "BF16",
}

# Which InferTensorContents field carries each datatype (FP16 has none).
CONTENTS_FIELD: dict[str, str] = {
    "BYTES": "bytes_contents",
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model input or output as the model declares it; -1 = any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False  # an input a request may leave out (the graph has a default)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


BYTES = "BYTES"  # variable-length elements: numpy object arrays of `bytes`


def triton_type(datatype: str) -> str:
    """The name Triton's model configuration gives an OIP datatype: TYPE_FP32, and
    TYPE_STRING for BYTES."""
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"


def from_triton_type(data_type: str) -> str:
    """The OIP datatype of a model configuration's TYPE_ name (triton_type undone)."""
    return BYTES if data_type == "TYPE_STRING" else data_type.removeprefix("TYPE_")


_LENGTH = np.dtype("<u4")


def decode_bytes(name: str, shape: Sequence[int], raw: bytes | memoryview, cap: int) -> np.ndarray:
    """BYTES in the OIP binary layout: each element a little-endian u32 length, then
    that many bytes. The element count must match the shape; every element must be
    UTF-8 (ONNX Runtime's string tensors hold text)."""
    dims = check_shape(name, shape, 1, cap)
    view = memoryview(raw).cast("B")
    out, offset, count = [], 0, prod(dims)
    while offset < len(view):
        if offset + 4 > len(view):
            raise InvalidInput(f"input '{name}': BYTES data ends inside an element's length")
        size = int(np.frombuffer(view, _LENGTH, 1, offset)[0])
        offset += 4
        if offset + size > len(view):
            raise InvalidInput(f"input '{name}': a BYTES element runs past the data")
        out.append(_utf8(name, bytes(view[offset : offset + size])))
        offset += size
        if len(out) > count:
            break
    if len(out) != count:
        raise InvalidInput(
            f"input '{name}': shape {list(dims)} needs {count} BYTES elements, got {len(out)}"
        )
    array = np.empty(count, dtype=object)
    array[:] = out
    return array.reshape(dims)


def encode_bytes(array: np.ndarray) -> bytes:
    """An object array of bytes (or str, as UTF-8) in the OIP binary layout."""
    parts = []
    for item in array.reshape(-1):
        if not isinstance(item, str | bytes):
            raise TypeError(f"a BYTES element must be str or bytes, not {type(item).__name__}")
        data = item.encode() if isinstance(item, str) else item
        parts.append(len(data).to_bytes(4, "little"))
        parts.append(data)
    return b"".join(parts)


def _utf8(name: str, data: bytes) -> bytes:
    try:
        data.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"input '{name}': a BYTES element is not UTF-8 text") from None
    return data


def numpy_dtype(datatype: str, tensor: str) -> np.dtype:
    try:
        return OIP_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidInput(
            f"input '{tensor}': datatype '{datatype}' is not supported"
            f" (supported: {', '.join(OIP_TO_NUMPY)})"
        ) from None


MAX_RANK = 32  # numpy's own limit is 64


def check_shape(name: str, shape: Sequence[int], itemsize: int, cap: int) -> tuple[int, ...]:
    """A request tensor's dimensions, checked before anything is allocated for them:
    integers, none negative, a rank numpy can hold, and at most `cap` bytes even
    counting only the non-zero dimensions (so [0, 10**30] is refused too)."""
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input '{name}': rank {len(shape)} is above the limit of {MAX_RANK}")
    if any(isinstance(d, bool) or not isinstance(d, int) for d in shape):
        raise InvalidInput(f"input '{name}': shape {list(shape)} must hold integers")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input '{name}': shape {list(shape)} has a negative dimension")
    if prod(max(d, 1) for d in shape) * itemsize > cap:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} is larger than the {cap}-byte payload cap"
        )
    return tuple(int(d) for d in shape)


def check_payload_cap(name: str, total: int, cap: int) -> None:
    """Both front doors: `total` bytes of tensor data so far, `name` the input that
    brought it there."""
    if total > cap:
        raise InvalidInput(
            f"input '{name}': the request's tensor data exceeds the {cap}-byte payload cap"
        )


def from_raw(
    name: str, datatype: str, shape: Sequence[int], raw: bytes | memoryview, cap: int
) -> np.ndarray:
    """Decode raw little-endian bytes (no copy: the array views `raw`); the length
    must match shape x itemsize. BYTES: length-prefixed elements (decode_bytes)."""
    if datatype == BYTES:
        return decode_bytes(name, shape, raw, cap)
    dtype = numpy_dtype(datatype, name)
    dims = check_shape(name, shape, dtype.itemsize, cap)
    expected = prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"input '{name}': shape {list(dims)} of {datatype} needs {expected} bytes,"
            f" got {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def from_list(
    name: str, datatype: str, shape: Sequence[int], values: Sequence, cap: int
) -> np.ndarray:
    """Decode typed values (gRPC typed contents or JSON data, flat or nested). BYTES:
    strings (JSON) or bytes (gRPC bytes_contents)."""
    if datatype == BYTES:
        return _bytes_from_list(name, shape, values, cap)
    dtype = numpy_dtype(datatype, name)
    dims = check_shape(name, shape, dtype.itemsize, cap)
    if not _listlike(values):
        raise InvalidInput(f"input '{name}': 'data' must be a list of {datatype} values")
    try:
        if dtype.kind in "iu":  # JSON integers past 64 bits arrive as floats (orjson)
            raw = np.asarray(values)
            if raw.dtype.kind == "f" and bool((np.abs(raw) >= 2.0**63).any()):
                raise OverflowError("a value is out of range")
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidInput(f"input '{name}': data is not valid {datatype}: {exc}") from None
    if array.size != prod(dims):
        raise InvalidInput(
            f"input '{name}': shape {list(dims)} needs {prod(dims)} elements, got {array.size}"
        )
    return array.reshape(dims)


def _listlike(values: object) -> bool:
    """A JSON array or a protobuf repeated field: not a scalar, string or object
    (`"data": false` is not one value of a tensor)."""
    return not isinstance(values, (dict, str, bytes, bool, int, float)) and values is not None


def _bytes_from_list(name: str, shape: Sequence[int], values: Sequence, cap: int) -> np.ndarray:
    dims = check_shape(name, shape, 1, cap)
    if not _listlike(values):
        raise InvalidInput(f"input '{name}': 'data' must be a list of BYTES values (strings)")
    flat: list[bytes] = []
    stack = [iter(values)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list | tuple):
                stack.append(iter(item))
                break
            if isinstance(item, str):
                flat.append(item.encode())
            elif isinstance(item, bytes):
                flat.append(_utf8(name, item))
            else:
                raise InvalidInput(f"input '{name}': BYTES data must be strings")
        else:
            stack.pop()
    if len(flat) != prod(dims):
        raise InvalidInput(
            f"input '{name}': shape {list(dims)} needs {prod(dims)} elements, got {len(flat)}"
        )
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(dims)


def text_values(array: np.ndarray) -> list[str]:
    """A BYTES array's elements as JSON strings (UTF-8; what is not, replaced)."""
    return [
        i.decode("utf-8", "replace") if isinstance(i, bytes) else str(i) for i in array.reshape(-1)
    ]


def check_against_spec(
    spec: TensorSpec, datatype: str, shape: Sequence[int], model: str = ""
) -> None:
    """Raise InvalidInput when a request tensor does not fit the model's input, worded
    as Triton words it (its clients and examples match these texts)."""
    if datatype != spec.datatype:
        raise InvalidInput(
            f"inference input '{spec.name}' data-type is '{datatype}', but model '{model}' "
            f"expects '{spec.datatype}'"
        )
    fits = len(shape) == len(spec.shape) and all(
        want < 0 or got == want for got, want in zip(shape, spec.shape, strict=True)
    )
    if not fits:
        raise InvalidInput(
            f"unexpected shape for input '{spec.name}' for model '{model}'. "
            f"Expected {_dims(spec.shape)}, got {_dims(shape)}"
        )


def _dims(shape: Sequence[int]) -> str:
    """Dimensions as Triton writes them: [-1,16]."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def oip_datatype(array: np.ndarray) -> str:
    return NUMPY_TO_OIP.get(array.dtype, "BYTES")


def byte_view(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous numeric array, without a copy (also when it holds
    no elements, which memoryview.cast refuses)."""
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def raw_view(array: np.ndarray) -> bytes | memoryview:
    """An output's bytes on the wire (row-major, little-endian; BYTES length-prefixed),
    as a view of the array when its memory already is that (a uint8 view: its len()
    is its size in bytes)."""
    if array.dtype == object:
        return encode_bytes(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return byte_view(np.ascontiguousarray(array))


def to_raw(array: np.ndarray) -> bytes:
    """raw_view's bytes as their own copy (protobuf fields take bytes)."""
    raw = raw_view(array)
    return raw if isinstance(raw, bytes) else raw.tobytes()
