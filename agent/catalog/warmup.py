"""Triton's `model_warmup` in config.pbtxt: the samples a load runs before the model
serves, read and checked when the model is found.

Each sample names its data for every model input: zeros (`zero_data`), random
values (`random_data`; zeros for STRING, as in Triton) or a file's
(`input_data_file`, a plain name in the model's `warmup/` folder holding one
sample's values in row-major order, STRING elements each a little-endian u32
length and its bytes). `dims` leave out the batch dimension when the model batches;
a sample of `batch_size` n repeats its values n times, and runs `count` times (once
when 0). The runner runs them on the new session before the model is loaded
(agent/runners/sessions.py); one that fails fails the load, naming the sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeplex.agent.catalog.config_message import one
from edgeplex.agent.catalog.model_files import model_file_size, read_model_file
from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.tensors import (
    BYTES,
    OIP_TO_NUMPY,
    decode_bytes,
    from_triton_type,
    triton_type,
)

WARMUP_DIR = "warmup"  # a model's warm-up data files, as in Triton
MAX_WARMUP_BYTES = 64 << 20  # all of a model's samples, at their batch sizes

Declared = tuple[str, tuple[int, ...]]  # an input as the config declares it: datatype, dims


@dataclass(frozen=True)
class WarmupInput:
    name: str
    datatype: str  # OIP name: FP32, BYTES, ...
    dims: tuple[int, ...]  # one sample's, without the batch dimension when batching
    fill: str  # "zero", "random" or "file"
    # For "file": the file in the model's warmup folder, read each time the sample is
    # sent (a catalog of thousands of models keeps none of them in memory), its size
    # when the model was found, and how errors name the input.
    file: str = ""
    folder: Path | None = field(default=None, compare=False)
    size: int = 0
    where: str = field(default="", compare=False)

    def array(self, batch: int | None, rng: np.random.Generator) -> np.ndarray:
        """The input's values, with a leading batch dimension of `batch` (None: the
        model does not batch). ValueError when its file cannot be read as declared."""
        dtype = OIP_TO_NUMPY.get(self.datatype, np.dtype(object))
        if self.fill == "file":
            one = _read(self.file, self.datatype, self.dims, self.where, self.folder)
        elif self.fill == "random" and dtype.kind == "f":
            one = rng.random(self.dims).astype(dtype)
        elif self.fill == "random" and dtype.kind in "iu":
            one = rng.integers(0, 2, self.dims).astype(dtype)  # 0 or 1: a valid index
        elif self.fill == "random" and dtype.kind == "b":
            one = rng.integers(0, 2, self.dims).astype(bool)
        elif dtype.kind == "O":
            one = np.full(self.dims, b"", dtype=object)
        else:
            one = np.zeros(self.dims, dtype)
        return one if batch is None else np.broadcast_to(one, (batch, *self.dims))


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int
    runs: int
    inputs: tuple[WarmupInput, ...]
    batched: bool  # the model batches: inputs get a leading dimension of batch_size

    def arrays(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        batch = self.batch_size if self.batched else None
        return {i.name: np.ascontiguousarray(i.array(batch, rng)) for i in self.inputs}

    def nbytes(self) -> int:
        return sum(_sample_bytes(i) for i in self.inputs) * self.batch_size

    def config_json(self) -> dict[str, Any]:
        """The sample as Triton's model config endpoint returns it."""
        inputs = {}
        for item in self.inputs:
            entry: dict[str, Any] = {
                "data_type": triton_type(item.datatype),
                "dims": list(item.dims),
            }
            if item.fill == "file":
                entry["input_data_file"] = item.file
            else:
                entry[f"{item.fill}_data"] = True
            inputs[item.name] = entry
        return {"name": self.name, "batch_size": self.batch_size, "count": self.runs,
                "inputs": inputs}  # fmt: skip


def warmup_samples(
    blocks: list[Any],
    max_batch_size: int,
    declared: dict[str, Declared],
    directory: Path | None,
    fed: set[str] | frozenset[str] = frozenset(),
    optional: set[str] | frozenset[str] = frozenset(),
) -> tuple[WarmupSample, ...]:
    """The `model_warmup` samples of a parsed config, for a model batching up to
    `max_batch_size` whose config declares the inputs `declared` (name: datatype and
    dims; empty when it declares none, and the graph then has the last word), of
    which a sample may leave out those `optional`, and whose sequence batcher fills
    in the inputs `fed` (a sample names them too). Raises ValueError naming the
    sample for what cannot run as written."""
    samples = []
    for index, block in enumerate(blocks):
        name = str(one(block, "name", "")) or f"#{index}"
        where = f"model_warmup '{name}'"
        batch_size = int(one(block, "batch_size", 0))
        if batch_size < 1:
            raise ValueError(f"{where}: batch_size must be at least 1")
        if max_batch_size == 0 and batch_size != 1:
            raise ValueError(f"{where}: batch_size must be 1 for a model that does not batch")
        if batch_size > max(1, max_batch_size):
            raise ValueError(f"{where}: batch_size {batch_size} is above max_batch_size")
        inputs = tuple(
            _input(entry, where, declared, fed, directory) for entry in block.get("inputs", [])
        )
        if not inputs:
            raise ValueError(f"{where}: no inputs (a sample names data for every input)")
        missing = sorted(set(declared) - {i.name for i in inputs} - optional)
        if missing:
            raise ValueError(f"{where}: no data for input '{missing[0]}'")
        runs = max(1, int(one(block, "count", 0)))
        samples.append(WarmupSample(name, batch_size, runs, inputs, max_batch_size > 0))
    total = sum(s.nbytes() for s in samples)
    if total > MAX_WARMUP_BYTES:
        raise ValueError(f"model_warmup: its samples hold {total} bytes, more than "
                         f"{MAX_WARMUP_BYTES}")  # fmt: skip
    return tuple(samples)


def _input(
    entry: dict[str, list[Any]],
    where: str,
    declared: dict[str, Declared],
    fed: set[str] | frozenset[str],
    directory: Path | None,
) -> WarmupInput:
    name = str(one(entry, "key", ""))
    spec: dict[str, list[Any]] = one(entry, "value", {})
    where = f"{where}: input '{name}'"
    if declared and name not in declared and name not in fed:
        raise ValueError(f"{where} is not an input of the model")
    datatype = from_triton_type(str(one(spec, "data_type", "TYPE_INVALID")))
    if datatype not in OIP_TO_NUMPY and datatype != BYTES:
        raise ValueError(f"{where}: data_type {one(spec, 'data_type', '')!r} cannot be fed")
    dims = tuple(int(d) for d in spec.get("dims", []))
    if any(d < 0 for d in dims):
        raise ValueError(f"{where}: dims must be fixed, not {list(dims)}")
    if name in declared:
        own_type, own_dims = declared[name]
        if own_type != datatype:
            raise ValueError(f"{where}: data_type {datatype} is not the input's ({own_type})")
        if len(own_dims) != len(dims) or any(
            d not in (-1, w) for d, w in zip(own_dims, dims, strict=True)
        ):
            raise ValueError(f"{where}: dims {list(dims)} do not fit the input's {list(own_dims)}")
    file = str(one(spec, "input_data_file", ""))
    if file:
        size = _size(file, datatype, dims, where, directory)
        folder = None if directory is None else directory / WARMUP_DIR
        return WarmupInput(name, datatype, dims, "file", file, folder, size, where)
    fill = "random" if one(spec, "random_data", False) else "zero"
    return WarmupInput(name, datatype, dims, fill)


def _size(
    file: str, datatype: str, dims: tuple[int, ...], where: str, directory: Path | None
) -> int:
    """The size of a sample's `file`, checked when the model is found: inside the
    model's warmup folder, under the cap, and of the size `dims` need (BYTES: its
    elements are read when it is sent)."""
    where = f"{where}: input_data_file {file!r}"
    if directory is None:
        raise ValueError(f"{where}: the model's folder is not known")
    folder, place = directory / WARMUP_DIR, f"{WARMUP_DIR} folder"
    size = model_file_size(folder, file, MAX_WARMUP_BYTES, where, place)
    _check_size(size, datatype, dims, where)
    return size


def _check_size(size: int, datatype: str, dims: tuple[int, ...], where: str) -> None:
    """A numeric sample's file holds exactly its dims' values (BYTES: any length)."""
    dtype = OIP_TO_NUMPY.get(datatype)
    need = math.prod(dims) * (dtype.itemsize if dtype is not None else 0)
    if dtype is not None and size != need:
        raise ValueError(f"{where} holds {size} bytes; dims {list(dims)} of {datatype} need {need}")


def _read(
    file: str, datatype: str, dims: tuple[int, ...], where: str, folder: Path | None
) -> np.ndarray:
    """One sample's values from `file` in the model's warmup `folder`, read now."""
    where = f"{where}: input_data_file {file!r}"
    if folder is None:
        raise ValueError(f"{where}: the model's folder is not known")
    data = read_model_file(folder, file, MAX_WARMUP_BYTES, where, f"{WARMUP_DIR} folder")
    _check_size(len(data), datatype, dims, where)  # it may have changed since
    if datatype == BYTES:
        try:
            return decode_bytes(file, dims, data, MAX_WARMUP_BYTES)
        except InvalidInput as exc:
            raise ValueError(f"{where}: {exc}") from None
    return np.frombuffer(data, dtype=OIP_TO_NUMPY[datatype]).reshape(dims)


def _sample_bytes(item: WarmupInput) -> int:
    if item.datatype == BYTES:  # its file as sent, or each empty element's u32 length
        return item.size if item.fill == "file" else 4 * math.prod(item.dims)
    return math.prod(item.dims) * OIP_TO_NUMPY[item.datatype].itemsize
