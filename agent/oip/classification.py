"""Triton's classification extension: an output requested with the parameter
`classification: k` answers with its k highest values, per batch row, as BYTES
"value:index" strings, with ":label" after them when the model's config names a
label file for the output (`label_filename`, one label per line). Values are
written as Triton writes them (C++ `std::to_string`: six decimals for floating
types); equal values keep index order. Pure: no I/O, no state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgeplex.agent.oip.errors import InvalidInput

# Classes one output may answer with, over all its rows: a string each, about twenty
# times the bytes of the value it stands for, so a count is capped before the run.
MAX_CLASSES = 1 << 16


def check(wanted: Mapping[str, int], datatypes: Mapping[str, str], rows: int = 1) -> None:
    """Refuse a request whose classification asks for something no output can give: a
    count below 1, more than MAX_CLASSES over its `rows`, or an output of strings
    (`datatypes`: each output's OIP type)."""
    for name, count in wanted.items():
        if count < 1:
            raise InvalidInput(f"output '{name}': 'classification' must be at least 1")
        if count * rows > MAX_CLASSES:
            raise InvalidInput(
                f"output '{name}': 'classification' {count} for {rows} rows is more than "
                f"{MAX_CLASSES} classes"
            )
        if datatypes.get(name) == "BYTES":
            raise InvalidInput(f"output '{name}': BYTES outputs cannot be classified")


def classify(
    outputs: dict[str, np.ndarray],
    wanted: Mapping[str, int],
    labels: Mapping[str, Sequence[str]],
    batched: bool,
) -> dict[str, np.ndarray]:
    """`outputs` with each one in `wanted` replaced by its top entries (at most the
    count asked): [batch, k] when the model batches, else [k]."""
    out = dict(outputs)
    for name, count in wanted.items():
        array = outputs.get(name)
        if array is None:
            continue
        by_row = batched and array.ndim > 0
        rows = array.reshape(array.shape[0] if by_row else 1, -1)
        classes = np.empty((rows.shape[0], min(count, rows.shape[1])), dtype=object)
        for i, row in enumerate(rows):
            classes[i, :] = _top(row, classes.shape[1], labels.get(name, ()))
        out[name] = classes if by_row else classes[0]
    return out


def _top(row: np.ndarray, count: int, labels: Sequence[str]) -> list[bytes]:
    order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
    floating = row.dtype.kind == "f"
    found = []
    for index in order.tolist():
        value = row[index]
        text = f"{value:f}" if floating else str(int(value))
        text += f":{index}"
        if index < len(labels) and labels[index]:
            text += f":{labels[index]}"
        found.append(text.encode())
    return found
