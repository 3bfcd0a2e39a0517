"""Open Inference Protocol datatypes and tensor (de)coding.

Pure functions, no I/O: the front doors call them to turn wire tensors into
numpy arrays and back. Every error is an InvalidInput naming the tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from edgeplex.agent.errors import InvalidInput

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

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


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
    must match shape x itemsize."""
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
    """Decode typed values (gRPC typed contents or JSON data, flat or nested)."""
    dtype = numpy_dtype(datatype, name)
    dims = check_shape(name, shape, dtype.itemsize, cap)
    if isinstance(values, (dict, str, bytes)) or values is None:
        raise InvalidInput(f"input '{name}': 'data' must be a list of {datatype} values")
    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidInput(f"input '{name}': data is not valid {datatype}: {exc}") from None
    if array.size != prod(dims):
        raise InvalidInput(
            f"input '{name}': shape {list(dims)} needs {prod(dims)} elements, got {array.size}"
        )
    return array.reshape(dims)


def check_against_spec(spec: TensorSpec, datatype: str, shape: Sequence[int]) -> None:
    """Raise InvalidInput when a request tensor does not fit the model's input."""
    if datatype != spec.datatype:
        raise InvalidInput(
            f"input '{spec.name}': datatype {datatype} does not match the model's {spec.datatype}"
        )
    if len(shape) != len(spec.shape):
        raise InvalidInput(
            f"input '{spec.name}': shape {list(shape)} has rank {len(shape)},"
            f" the model expects {list(spec.shape)}"
        )
    for got, want in zip(shape, spec.shape, strict=True):
        if want >= 0 and got != want:
            raise InvalidInput(
                f"input '{spec.name}': shape {list(shape)} does not match the model's"
                f" {list(spec.shape)}"
            )


def oip_datatype(array: np.ndarray) -> str:
    return NUMPY_TO_OIP.get(array.dtype, "BYTES")


def to_raw(array: np.ndarray) -> bytes:
    """Row-major little-endian bytes of an array."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()
