"""A model's interface (inputs, outputs, batching) known before it is loaded.

Read from the ONNX file when the model is found in the repository (graph.py),
so a request can be validated, and refused, before anything is promoted.
Pure: the owner writes what it finds into the record, or fails a model that
cannot be served as configured with the reason given here.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import NamedTuple

from edgeplex.agent.catalog.graph import GraphError, Interface, read_interface
from edgeplex.agent.catalog.repository import ModelSource
from edgeplex.agent.catalog.triton_config import DeclaredTensor
from edgeplex.agent.oip.tensors import TensorSpec
from edgeplex.agent.residency.state import DEFAULT_MAX_BATCH_SIZE

UNSUPPORTED = ("BF16",)
log = logging.getLogger("edgeplex.agent")


class Described(NamedTuple):
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int


def describe(key: object, source: ModelSource) -> Described | str:
    """The interface of the model `source` holds, or why it cannot be served as
    configured. `key` names the model in the warnings logged."""
    for warning in source.warnings:  # also in the model's status
        log.warning("model %s: %s", key, warning)
    if source.config is None:
        return source.config_error
    try:
        interface = read_interface(source.path)
    except GraphError as exc:
        return f"not a readable ONNX model ({exc})"
    for spec in interface.inputs + interface.outputs:
        if spec.datatype in UNSUPPORTED or not spec.datatype.isupper():
            return f"tensor '{spec.name}' has type {spec.datatype}, not supported"
    if not interface.outputs:
        return "the graph has no outputs"
    specs = interface.inputs + interface.outputs
    batchable = all(s.shape and s.shape[0] == -1 for s in specs)
    wanted = source.config.max_batch_size
    graph_inputs = _with_optional(interface, source.declared_inputs)
    if isinstance(graph_inputs, str):
        return graph_inputs
    mismatch = _declared_mismatch(source, graph_inputs, "input", wanted) or _declared_mismatch(
        source, interface.outputs, "output", wanted
    )
    if mismatch:
        return mismatch
    if wanted is None:
        max_batch = DEFAULT_MAX_BATCH_SIZE if batchable else 0
    elif wanted > 0 and not batchable:
        return (
            f"max_batch_size {wanted} needs a dynamic leading dimension on every input"
            " and output, and this model has none"
        )
    else:
        max_batch = wanted
    optional = [t.name for t in graph_inputs if t.optional]
    if optional and max_batch:  # as Triton's onnxruntime backend refuses it
        return f"optional input '{optional[0]}' is not supported for models that support batching"
    if source.config.response_cache and source.sequence is not None:  # Triton refuses it too
        return "the response cache does not support a model with sequence batching"
    too_large = [n for n in source.config.preferred_batch_sizes if n > max_batch]
    if too_large:  # Triton's words
        return (
            f"dynamic batching preferred size must be <= max batch size: {too_large[0]} is "
            f"larger than max_batch_size {max_batch}"
        )
    inputs = _as_clients_see(graph_inputs, source.declared_inputs, max_batch)
    outputs = _as_clients_see(interface.outputs, source.declared_outputs, max_batch)
    return Described(inputs, outputs, max_batch)


def _with_optional(
    interface: Interface, declared: tuple[DeclaredTensor, ...]
) -> tuple[TensorSpec, ...] | str:
    """The graph's inputs with those config.pbtxt declares `optional`: graph inputs
    that an initializer gives a default, which a request may leave out. Why not,
    for an optional input without a default or a defaulted one not declared so."""
    defaulted = {s.name: s for s in interface.defaulted}
    required = {s.name for s in interface.inputs}
    optional = []
    for t in declared:
        if t.optional and t.name in required:
            return (
                f"config.pbtxt: input '{t.name}' is optional, and the graph has no default for "
                "it (only a graph input that an initializer of its name gives a value can be "
                "left out)"
            )
        if t.name in defaulted and not t.optional:
            return (
                f"config.pbtxt: input '{t.name}' has a default in the graph (an initializer): "
                "declare it `optional: true`"
            )
        if t.optional and t.name in defaulted:
            optional.append(replace(defaulted[t.name], optional=True))
    return interface.inputs + tuple(optional)


def _as_clients_see(
    graph: tuple[TensorSpec, ...], declared: tuple[DeclaredTensor, ...], max_batch: int
) -> tuple[TensorSpec, ...]:
    """The graph's tensors, those config.pbtxt reshapes with the shape clients send and
    receive (its `dims`; the runner reshapes them for the graph)."""
    dims = {t.name: t.dims for t in declared if t.reshape is not None}
    if not dims:
        return graph
    batch = (-1,) if max_batch else ()
    return tuple(
        replace(spec, shape=batch + dims[spec.name]) if spec.name in dims else spec
        for spec in graph
    )


def _declared_mismatch(
    source: ModelSource, graph: tuple[TensorSpec, ...], what: str, max_batch: int | None
) -> str:
    """How config.pbtxt's declared tensors disagree with the graph ("" if they agree).
    With max_batch_size > 0, declared dims leave out the batch dimension."""
    declared = source.declared_inputs if what == "input" else source.declared_outputs
    by_name = {t.name: t for t in graph}
    for t in declared:
        spec = by_name.get(t.name)
        if spec is None:
            names = ", ".join(sorted(by_name)) or "none"
            return f"config.pbtxt declares {what} '{t.name}'; the graph's {what}s are {names}"
        if t.datatype != spec.datatype:
            return f"config.pbtxt: {what} '{t.name}' is {t.datatype}; the graph has {spec.datatype}"
        dims = ((-1,) if max_batch else ()) + (t.dims if t.reshape is None else t.reshape)
        agree = len(dims) == len(spec.shape) and all(
            a == b or a == -1 or b == -1 for a, b in zip(dims, spec.shape, strict=True)
        )
        if not agree:
            shown = list(t.dims if t.reshape is None else t.reshape)
            return (
                f"config.pbtxt: {what} '{t.name}' {'dims' if t.reshape is None else 'reshape'} "
                f"{shown} (max_batch_size {max_batch or 0}) "
                f"do not match the graph's shape {list(spec.shape)}"
            )
    return ""
