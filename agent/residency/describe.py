"""A model's interface (inputs, outputs, batching) known before it is loaded.

Read from the ONNX file when the model is found in the repository (graph.py),
so a request can be validated, and refused, before anything is promoted.
A model that cannot be served as configured is FAILED here with the reason.
"""

from __future__ import annotations

from edgeplex.agent.graph import GraphError, read_interface
from edgeplex.agent.residency.state import DEFAULT_MAX_BATCH_SIZE, ModelRecord, Phase

UNSUPPORTED = ("BYTES", "BF16")


def describe(record: ModelRecord) -> None:
    """Fill in `record`'s interface, or move it to FAILED with the reason. Called by
    the owner when it first sees a source (no other writer)."""
    source = record.source
    if source.config is None:
        _fail(record, source.config_error)
        return
    try:
        interface = read_interface(source.path)
    except GraphError as exc:
        _fail(record, f"not a readable ONNX model ({exc})")
        return
    for spec in interface.inputs + interface.outputs:
        if spec.datatype in UNSUPPORTED or not spec.datatype.isupper():
            _fail(record, f"tensor '{spec.name}' has type {spec.datatype}, not supported")
            return
    if not interface.outputs:
        _fail(record, "the graph has no outputs")
        return
    specs = interface.inputs + interface.outputs
    batchable = all(s.shape and s.shape[0] == -1 for s in specs)
    wanted = source.config.max_batch_size
    if wanted is None:
        max_batch = DEFAULT_MAX_BATCH_SIZE if batchable else 0
    elif wanted > 0 and not batchable:
        _fail(
            record,
            f"max_batch_size {wanted} needs a dynamic leading dimension on every input"
            " and output, and this model has none",
        )
        return
    else:
        max_batch = wanted
    record.inputs, record.outputs = interface.inputs, interface.outputs
    record.max_batch_size = max_batch


def _fail(record: ModelRecord, reason: str) -> None:
    record.enter(Phase.FAILED)
    record.reason = reason
