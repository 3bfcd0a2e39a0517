"""An inference request as the core sees it, and its validation against the
model's interface (known before the model is loaded, so bad input is refused
before anything is promoted). Pure: no I/O, no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.tensors import check_against_spec
from edgeplex.agent.residency.state import ModelRecord


@dataclass
class InferInput:
    name: str
    datatype: str
    shape: list[int]
    array: np.ndarray


def validate(
    record: ModelRecord, inputs: list[InferInput], outputs: list[str] | None
) -> tuple[dict[str, np.ndarray], int]:
    """Check a request against the model's interface, which is known before the model
    is loaded: the arrays by input name, and the batch size. Raises InvalidInput."""
    specs = {s.name: s for s in record.inputs}
    given: dict[str, np.ndarray] = {}
    for tensor in inputs:
        spec = specs.get(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"model '{record.name}' has no input '{tensor.name}' (inputs: {', '.join(specs)})"
            )
        if tensor.name in given:
            raise InvalidInput(f"input '{tensor.name}' is given twice")
        check_against_spec(spec, tensor.datatype, tensor.shape, record.name)
        given[tensor.name] = tensor.array
    missing = [n for n, spec in specs.items() if n not in given and not spec.optional]
    if missing:
        raise InvalidInput(f"model '{record.name}': missing input '{missing[0]}'")
    if outputs is not None:
        known = {s.name for s in record.outputs}
        for out in outputs:
            if out not in known:
                raise InvalidInput(f"model '{record.name}' has no output '{out}'")
    batch = 1
    if record.max_batch_size:
        sizes = {a.shape[0] for a in given.values()}
        if len(sizes) != 1:
            raise InvalidInput(
                f"model '{record.name}': inputs disagree on the batch dimension ({sorted(sizes)})"
            )
        batch = sizes.pop()
        if not 1 <= batch <= record.max_batch_size:
            first = next(iter(given))
            raise InvalidInput(
                f"input '{first}': batch size {batch} is outside 1..{record.max_batch_size}"
            )
    return given, batch
