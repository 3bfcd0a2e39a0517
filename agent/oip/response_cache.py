"""Triton's response cache: a model's answers kept by what was asked, so that the
same request is answered again without running the model, or promoting it.

A request's key is a BLAKE2b digest of the model's name and version (with its
artifact's digest, so that a replaced model file answers anew), the outputs
it asks for, and each input's name, datatype, shape and values, in name order:
one pass over the input bytes, at C speed. Answers are kept, least recently used
going first, within the agent's `response_cache_bytes` (their outputs' bytes);
one larger than an eighth of it is not kept, so that no single answer empties
the cache. A kept answer is a read-only copy (outputs may be views of a buffer
the runner reuses), handed out as it is on every hit.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

Outputs = dict[str, np.ndarray]
OFFLOAD_BYTES = 1 << 20  # inputs larger than this are digested off the event loop


class ResponseCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self._answers: OrderedDict[bytes, tuple[Outputs, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    @staticmethod
    def key(model: str, version: str, inputs: Outputs, wanted: list[str] | None) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        _text(digest, model)
        _text(digest, version)
        if wanted is None:  # every output
            digest.update(b"\0")
        else:
            digest.update(b"\1" + len(wanted).to_bytes(4, "little"))
            for name in sorted(wanted):
                _text(digest, name)
        digest.update(len(inputs).to_bytes(4, "little"))
        for name in sorted(inputs):
            array = inputs[name]
            _text(digest, name)
            _text(digest, array.dtype.str)
            digest.update(array.ndim.to_bytes(4, "little"))  # then the shape sets the size
            digest.update(np.asarray(array.shape, "<i8").tobytes())
            if array.dtype == object:  # BYTES: each element's length, then its bytes
                for item in array.ravel():
                    digest.update(len(item).to_bytes(4, "little"))
                    digest.update(item)
            else:
                digest.update(np.ascontiguousarray(array).data)
        return digest.digest()

    def get(self, key: bytes) -> Outputs | None:
        found = self._answers.get(key)
        if found is None:
            return None
        self._answers.move_to_end(key)
        return found[0]

    def put(self, key: bytes, outputs: Outputs) -> None:
        size = nbytes(outputs)
        if size > self.budget_bytes // 8 or key in self._answers:
            return
        kept = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)
            copy.setflags(write=False)
            kept[name] = copy
        while self._answers and self.bytes + size > self.budget_bytes:
            _, (_, freed) = self._answers.popitem(last=False)
            self.bytes -= freed
        self._answers[key] = (kept, size)
        self.bytes += size


def _text(digest: hashlib.blake2b, text: str) -> None:  # length-prefixed: none read alike
    data = text.encode()
    digest.update(len(data).to_bytes(4, "little"))
    digest.update(data)


def nbytes(arrays: Outputs) -> int:
    """The bytes `arrays` hold (BYTES elements: their lengths, and 8 for each)."""
    total = 0
    for array in arrays.values():
        if array.dtype == object:
            total += sum(len(item) for item in array.ravel()) + 8 * array.size
        else:
            total += int(array.nbytes)
    return total
