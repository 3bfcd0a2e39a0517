"""A staged model's weights, kept mapped by the runner and handed to ONNX Runtime.

A staged copy is a small graph plus one weights file in host RAM (sessions.py).
Left to itself, ONNX Runtime maps that file anew for every session it creates
and unmaps it when the session goes: each promotion then pays the mapping's
page faults in its first run, and each release the unmap (with a 13 MB MLP on
this project's 2-vCPU VM: about 1.4 ms of creation and first run and 0.34 ms
of release). Here the runner maps each staged weights file once, populated,
and creates the session with the graph's external initializers given as
OrtValues over that mapping (`SessionOptions.add_initializer`): ORT then neither
maps nor copies them. The same promotion costs about 0.4 ms, the release
nothing, and the session computes bit for bit what the mapped one does.

Only for sessions on the CPU provider without prepacking: a prepacked session
copies its weights anyway, and on CUDA the upload is the copy. A graph whose
weights this cannot describe (another file, an unknown type, sizes that do not
add up) is loaded the usual way.

The mapping adds no memory (the pages are the staged file's, in host RAM
already); it must not outlive the file, though, or its pages would stay after
the agent deletes the staged copy. `WeightMaps.sweep` drops the mappings of
files that are gone; the runner calls it at least once a second. A session
holds on to its own mapping while it lives.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
from math import prod
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeplex.agent.catalog import graph
from edgeplex.agent.runners import ipc

log = logging.getLogger("edgeplex.runner")

# TensorProto.DataType -> numpy, for the types a session can take from memory.
NUMPY_OF_ONNX = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}


class Unusable(Exception):
    """The staged copy's weights cannot be handed in; load it the usual way."""


def mappable(request: ipc.LoadModel) -> bool:
    """Loads whose session takes its weights from the kept mapping: CPU, no prepacking."""
    cpu = request.provider == "cpu" and not request.prepack_weights
    return cpu and request.mapped_weights


class StagedWeights:
    """One staged weights file, mapped and populated, as OrtValues by initializer."""

    def __init__(self, model_file: Path, weights_file: Path) -> None:
        try:
            described = graph.read_external_weights(model_file)
        except graph.GraphError as exc:
            raise Unusable(str(exc)) from None
        if not described:
            raise Unusable("no external weights")
        fd = os.open(weights_file, os.O_RDONLY)
        try:
            stat = os.fstat(fd)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.path = str(weights_file)
        self.identity = (stat.st_dev, stat.st_ino)
        self.nbytes = stat.st_size
        # What the staged copy holds in host RAM (graph and weights): what a model
        # loaded over this mapping reports it holds.
        self.staged_bytes = sum(
            e.stat().st_size for e in os.scandir(weights_file.parent) if e.is_file()
        )
        data = np.frombuffer(self._map, dtype=np.uint8)
        self.values: dict[str, ort.OrtValue] = {}
        self.arrays: dict[str, np.ndarray] = {}  # the same bytes, as run feeds
        for weight in described:
            dtype = NUMPY_OF_ONNX.get(weight.data_type)
            if weight.location != weights_file.name or dtype is None:
                raise Unusable(f"initializer '{weight.name}' lies elsewhere or has another type")
            size = prod(weight.dims) * np.dtype(dtype).itemsize
            if size != weight.length or weight.offset + size > len(data):
                raise Unusable(f"initializer '{weight.name}': its bytes do not match its shape")
            array: np.ndarray = data[weight.offset : weight.offset + size].view(dtype)
            array = array.reshape(weight.dims)
            self.values[weight.name] = ort.OrtValue.ortvalue_from_numpy(array)
            self.arrays[weight.name] = array
        # The graph without these weights (graph.weights_as_inputs), when it can be
        # written: one session of it serves every model that has the same one.
        try:
            self.weightless: bytes | None = graph.weights_as_inputs(model_file, described)
        except (graph.GraphError, OSError):
            self.weightless = None
        self.weightless_digest = hashlib.sha256(self.weightless or b"").hexdigest()

    def hand_to(self, options: ort.SessionOptions) -> None:
        for name, value in self.values.items():
            options.add_initializer(name, value)


class WeightMaps:
    """The runner's mapped staged weights, by staged directory."""

    def __init__(self) -> None:
        self._maps: dict[str, StagedWeights] = {}

    def get(self, staged: Path, model_file: Path, weights_file: Path) -> StagedWeights | None:
        """The weights of this staged copy (mapped now if not yet), or None when they
        cannot be handed in."""
        key = str(staged)
        kept = self._maps.get(key)
        if kept is not None:
            try:
                if _identity(weights_file) == kept.identity:
                    return kept
            except OSError:
                pass
            del self._maps[key]  # staged again, or gone: the mapping is of an old file
        try:
            kept = StagedWeights(model_file, weights_file)
        except (Unusable, OSError, ValueError) as exc:
            log.debug("%s: weights not handed in (%s)", staged.name, exc)
            return None
        self._maps[key] = kept
        return kept

    def peek(self, staged: str) -> StagedWeights | None:
        """The kept mapping of the staged copy in directory `staged` if it is current;
        never maps (one stat: asked on the path of every promotion)."""
        kept = self._maps.get(staged)
        try:
            current = kept is not None and _identity(kept.path) == kept.identity
        except OSError:
            current = False
        return kept if current else None

    def sweep(self) -> None:
        """Forget the mappings of weights files that are gone or were replaced."""
        for key, kept in list(self._maps.items()):
            try:
                current = _identity(kept.path) == kept.identity
            except OSError:
                current = False
            if not current:
                del self._maps[key]

    def __len__(self) -> int:
        return len(self._maps)


def _identity(path: str | Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino
