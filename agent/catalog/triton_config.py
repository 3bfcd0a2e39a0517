"""Triton's `config.pbtxt`, read as an edgeplex model config.

A Triton model repository works unchanged: `<repo>/<model>/config.pbtxt` is
parsed as Triton parses it, protobuf text format into Triton's `ModelConfig`
(the generated module tritonclient ships), so a field Triton does not know is
an error naming its line. Of the fields that are set, those below are acted
on; every other one is named in a warning (logged, and in the model's status),
never dropped silently:

| config.pbtxt | edgeplex |
| --- | --- |
| `name` | must match the model's directory |
| `default_model_filename` | the graph's file in each version folder (model.onnx) |
| `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"` | required when set |
| `max_batch_size` | `max_batch_size` (dims then leave out the batch dimension) |
| `input`, `output` (`name`, `data_type`, `dims`) | checked against the graph |
| `output.label_filename` | the labels of a classification (oip/classification.py) |
| `input`, `output` `reshape` | clients see `dims`, the graph `reshape.shape` (runner reshapes) |
| `input.format` | returned with the config, for clients (Triton does not act on it either) |
| `input.optional` | may be left out: the graph's initializer gives it (no batching) |
| `dynamic_batching.max_queue_delay_microseconds` | `max_queue_delay_us` |
| `dynamic_batching.preferred_batch_size` | `preferred_batch_sizes` |
| `dynamic_batching.priority_levels`, `.default_priority_level` | the same |
| `response_cache.enable` | `response_cache` |
| `dynamic_batching.default_queue_policy` | `max_queue_size`, `timeout_ms` |
| `dynamic_batching.priority_queue_policy` | `priority_queue_policy` (a level's cap, timeout) |
| `sequence_batching` (controls, states, initial states, idle time) | a stateful model |
| `sequence_batching.direct` / `.oldest` `.max_queue_delay_microseconds` | `max_queue_delay_us` |
| `sequence_batching.oldest.preferred_batch_size` | `preferred_batch_sizes` |
| `sequence_batching.oldest.max_candidate_sequences` | the sequence slots per instance |
| `instance_group` (`count`, `kind`) | `instance_count` (summed over groups) |
| `instance_group.rate_limiter` | `rate_limit_resources`, `rate_limit_priority` |
| `version_policy` (`latest`, `all`, `specific`) | which versions are served |
| `parameters { key: "intra_op_thread_count" ... }` | `intra_op_threads` |
| `parameters`: ORT's session and CUDA options | passed to ONNX Runtime (ort_parameters.py) |
| `optimization.graph.level` | the level ORT optimizes the staged graph at (ort_parameters.py) |
| `model_warmup` (`zero_data`, `random_data`, `input_data_file`) | run by loads that warm up |

`KIND_GPU` needs `runner.execution_provider: cuda`; elsewhere the model fails
with the reason (repository.py).

A `config.yaml` beside it is laid over what `config.pbtxt` says: the
edgeplex-native file wins field by field (docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from edgeplex.agent.catalog import ort_parameters
from edgeplex.agent.catalog.config_message import Message as Message
from edgeplex.agent.catalog.config_message import one
from edgeplex.agent.catalog.model_files import plain_name, read_model_file
from edgeplex.agent.catalog.sequence_config import (
    SEQUENCE_FIELDS,
    STATE_FIELDS,
    SequenceSpec,
    sequence_spec,
)
from edgeplex.agent.catalog.warmup import WarmupSample, warmup_samples
from edgeplex.agent.oip.tensors import from_triton_type, triton_type

if TYPE_CHECKING:
    from edgeplex.agent.catalog.model_config import LevelPolicy, ModelConfig
    from edgeplex.agent.residency.state import ModelRecord

PBTXT_FILE = "config.pbtxt"
MODEL_FILE = "model.onnx"  # a version's graph, unless default_model_filename names another
MAX_LABEL_BYTES = 4 << 20  # an output's label file (21k ImageNet classes take 0.5 MiB)


class PbtxtError(ValueError):
    pass


def parse_pbtxt(text: str) -> Message:
    """config.pbtxt read as Triton reads it: protobuf text format into Triton's
    `ModelConfig` (the module tritonclient ships), so a field Triton does not know is
    an error naming its line and column. Returned as nested {field: [values]}, enums
    by name, with only the fields that are set."""
    try:
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise PbtxtError(f"line {exc}") from None
    return _as_message(config)


def parse_config_json(text: str) -> Message:
    """A model config in JSON, as Triton's load takes it (the `config` parameter):
    protobuf's JSON mapping of `ModelConfig`, as strict as config.pbtxt."""
    try:
        config = json_format.Parse(text, model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        raise PbtxtError(str(exc)) from None
    return _as_message(config)


def _as_message(message: Any) -> Message:
    out: Message = {}
    for descriptor, value in message.ListFields():
        entry = descriptor.message_type
        if entry is not None and entry.GetOptions().map_entry:
            of_value = entry.fields_by_name["value"]
            out[descriptor.name] = [
                {"key": [key], "value": [_value(of_value, v)]} for key, v in sorted(value.items())
            ]
        elif descriptor.is_repeated:
            out[descriptor.name] = [_value(descriptor, v) for v in value]
        else:
            out[descriptor.name] = [_value(descriptor, value)]
    return out


def _value(descriptor: Any, value: Any) -> Any:
    if descriptor.message_type is not None:
        return _as_message(value)
    if descriptor.enum_type is not None:
        return descriptor.enum_type.values_by_number[value].name
    return value


# --- the mapping ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeclaredTensor:
    name: str
    datatype: str  # OIP name: FP32, BYTES, ...
    dims: tuple[int, ...]  # without the batch dimension when max_batch_size > 0
    # An output's class labels, one per index (label_filename): the classification
    # extension names them.
    labels: tuple[str, ...] = field(default=(), repr=False)  # compared: an edit reloads
    label_file: str = ""
    # `reshape`: the shape the graph has (without the batch dimension when batching)
    # where clients see `dims`; None when they are the same.
    reshape: tuple[int, ...] | None = None
    format: str = "FORMAT_NONE"  # an input's layout (FORMAT_NCHW, FORMAT_NHWC): for clients
    # An input a request may leave out (`optional`): the graph's initializer of that
    # name gives its value then.
    optional: bool = False


@dataclass(frozen=True)
class VersionPolicy:
    kind: str = "latest"  # latest | all | specific
    count: int = 1  # latest: how many
    versions: tuple[int, ...] = ()  # specific

    def select(self, available: list[int]) -> list[int]:
        """The versions the policy serves, newest first."""
        newest = sorted(available, reverse=True)
        if self.kind == "all":
            return newest
        if self.kind == "specific":
            return [v for v in newest if v in self.versions]
        return newest[: self.count]


@dataclass
class TritonConfig:
    settings: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields
    inputs: tuple[DeclaredTensor, ...] = ()
    outputs: tuple[DeclaredTensor, ...] = ()
    version_policy: VersionPolicy = VersionPolicy()
    warnings: list[str] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)  # instance_group kinds named
    sequence: SequenceSpec | None = None  # sequence_batching: a stateful model
    warmup: tuple[WarmupSample, ...] = ()  # model_warmup: run by loads that warm up
    # The onnxruntime backend's parameters passed to ONNX Runtime (ort_parameters.py).
    ort_parameters: dict[str, str] = field(default_factory=dict)
    model_file: str = MODEL_FILE  # default_model_filename: each version's graph


_TRITON_TYPES = {
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "STRING", "BF16",
}  # fmt: skip
SUPPORTED_PLATFORMS = ("onnxruntime_onnx",)
SUPPORTED_BACKENDS = ("onnxruntime",)
_PARAMETERS = {"intra_op_thread_count": "intra_op_threads"}
_HANDLED = {
    "name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching",
    "instance_group", "version_policy", "parameters", "sequence_batching", "response_cache",
    "model_warmup", "default_model_filename", "optimization",
}  # fmt: skip


def read_triton_config(path: Path, model: str) -> TritonConfig:
    """`config.pbtxt` at `path` for the model directory `model`. Raises ValueError
    (with the file's name) for what cannot be served as written."""
    try:
        data = parse_pbtxt(path.read_text())
    except (OSError, UnicodeDecodeError, PbtxtError) as exc:
        raise ValueError(f"{PBTXT_FILE}: {exc}") from None
    return triton_config(data, model, path.parent)


def triton_config(data: Message, model: str, directory: Path | None = None) -> TritonConfig:
    """A parsed `ModelConfig` (parse_pbtxt, parse_config_json) as edgeplex serves it,
    for the model in `directory` (the files a config may name: initial states).
    Raises ValueError for what cannot be served as written."""
    out = TritonConfig()
    name = one(data, "name", "")
    if name and name != model:
        raise ValueError(
            f"{PBTXT_FILE}: name {name!r} does not match the model's directory {model!r}"
        )
    platform, backend = one(data, "platform", ""), one(data, "backend", "")
    if platform and platform not in SUPPORTED_PLATFORMS:
        raise ValueError(
            f"{PBTXT_FILE}: platform {platform!r}: edgeplex serves ONNX models (onnxruntime_onnx)"
        )
    if backend and backend not in SUPPORTED_BACKENDS:
        raise ValueError(
            f"{PBTXT_FILE}: backend {backend!r}: edgeplex serves ONNX models (onnxruntime)"
        )
    for key in sorted(set(data) - _HANDLED):
        out.warnings.append(f"{PBTXT_FILE}: '{key}' is not supported and has no effect")
    out.model_file = model_file(data)
    if "max_batch_size" in data:
        out.settings["max_batch_size"] = int(one(data, "max_batch_size", 0))
    out.inputs = tuple(triton_tensor(t, "input", out.warnings) for t in data.get("input", []))
    out.outputs = tuple(
        triton_tensor(t, "output", out.warnings, directory) for t in data.get("output", [])
    )
    _batching(data.get("dynamic_batching", []), out)
    _instances(data.get("instance_group", []), out)
    _versions(data.get("version_policy", []), out)
    _parameters(data.get("parameters", []), out)
    _optimization(data.get("optimization", []), out)
    out.sequence = sequence_spec(data.get("sequence_batching", []), directory)
    _sequence_batching(data.get("sequence_batching", []), out)
    out.warmup = _warmup(data.get("model_warmup", []), out, directory)
    if "response_cache" in data:
        out.settings["response_cache"] = response_cache(data)
    policy = data.get("model_transaction_policy") or [{}]
    if any(policy[-1].get("decoupled") or []):
        raise ValueError(f"{PBTXT_FILE}: decoupled models are not supported")
    return out


def _warmup(
    blocks: list[Any], out: TritonConfig, directory: Path | None
) -> tuple[WarmupSample, ...]:
    """The warm-up samples, checked against the inputs the config declares (a stateful
    model's control and state inputs are named by its samples too, as in Triton)."""
    declared = {t.name: (t.datatype, t.dims) for t in out.inputs}
    fed = out.sequence.inputs if out.sequence is not None else set()
    max_batch_size = int(out.settings.get("max_batch_size", 0))
    optional = {t.name for t in out.inputs if t.optional}
    return warmup_samples(blocks, max_batch_size, declared, directory, fed, optional)


def model_file(data: Message) -> str:
    """The file each version folder holds the graph in: `default_model_filename`, a
    plain file name, or model.onnx. ValueError for a name that is not a plain one."""
    name = str(one(data, "default_model_filename", "")) or MODEL_FILE
    if not plain_name(name):
        raise ValueError(f"{PBTXT_FILE}: default_model_filename {name!r} is not a file name")
    return name


def triton_tensor(
    message: Any, what: str, warnings: list[str], directory: Path | None = None
) -> DeclaredTensor:
    """An input or output as declared; an output's label file is read from the model's
    `directory`."""
    if not isinstance(message, dict) or not one(message, "name", ""):
        raise ValueError(f"{PBTXT_FILE}: every {what} needs a name")
    name = str(one(message, "name", ""))
    data_type = str(one(message, "data_type", "TYPE_INVALID"))
    if data_type.removeprefix("TYPE_") not in _TRITON_TYPES:
        raise ValueError(
            f"{PBTXT_FILE}: {what} '{name}': data_type {data_type!r} is not a Triton type"
        )
    datatype = from_triton_type(data_type)
    used = {"name", "data_type", "dims", "reshape"} | (
        {"format", "optional"} if what == "input" else set()
    )
    labels: tuple[str, ...] = ()
    if what == "output" and directory is not None and "label_filename" in message:
        used.add("label_filename")
        labels = read_labels(directory, str(one(message, "label_filename", "")), name)
    for key in sorted(set(message) - used):
        warnings.append(
            f"{PBTXT_FILE}: {what} '{name}': '{key}' is not supported and has no effect"
        )
    dims = tuple(int(d) for d in message.get("dims", []))
    label_file = str(one(message, "label_filename", "")) if labels else ""
    reshape = _reshape(message, dims, f"{PBTXT_FILE}: {what} '{name}'")
    layout = str(one(message, "format", "FORMAT_NONE"))
    optional = bool(one(message, "optional", False))
    return DeclaredTensor(name, datatype, dims, labels, label_file, reshape, layout, optional)


def _reshape(message: Any, dims: tuple[int, ...], where: str) -> tuple[int, ...] | None:
    """A tensor's `reshape.shape`, checked: it holds as many elements as `dims` when
    both are fixed; each has at most one variable dimension (taken from the rest)."""
    blocks = message.get("reshape", [])
    if not blocks:
        return None
    shape = tuple(int(d) for d in blocks[-1].get("shape", []))
    for what, sizes in (("reshape", shape), ("dims", dims)):
        if sum(d == -1 for d in sizes) > 1 or any(d < -1 for d in sizes):
            raise ValueError(
                f"{where}: {what} {list(sizes)} may have one variable dimension (-1), with reshape"
            )
    if (-1 in shape) != (-1 in dims):
        raise ValueError(f"{where}: reshape {list(shape)} and dims {list(dims)} must both be "
                         "fixed or both variable")  # fmt: skip
    if -1 not in dims and math.prod(shape) != math.prod(dims):
        raise ValueError(
            f"{where}: reshape {list(shape)} does not hold the elements of dims {list(dims)}"
        )
    return shape


def read_labels(directory: Path, file: str, output: str) -> tuple[str, ...]:
    """An output's `label_filename`: a plain name in the model's directory, one label
    per line (UTF-8), as Triton reads it."""
    where = f"{PBTXT_FILE}: output '{output}': label_filename {file!r}"
    data = read_model_file(directory, file, MAX_LABEL_BYTES, where, "directory")
    try:
        return tuple(data.decode().splitlines())
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8") from None


def _batching(blocks: list[Any], out: TritonConfig) -> None:
    for block in blocks:
        if "max_queue_delay_microseconds" in block:
            out.settings["max_queue_delay_us"] = int(one(block, "max_queue_delay_microseconds", 0))
        for policy in block.get("default_queue_policy", []):
            out.settings.update(_queue_policy(policy, "default_queue_policy", out))
        levels = {}
        for entry in block.get("priority_queue_policy", []):
            level = int(one(entry, "key", 0))
            where = f"priority_queue_policy[{level}]"
            levels[level] = _queue_policy(one(entry, "value", {}), where, out)
        if levels:
            out.settings["priority_queue_policy"] = levels
        if block.get("preferred_batch_size"):
            out.settings["preferred_batch_sizes"] = [int(n) for n in block["preferred_batch_size"]]
        for key in ("priority_levels", "default_priority_level"):
            if key in block:
                out.settings[key] = int(one(block, key, 0))
        # preserve_ordering holds always: a stream's answers go back in its requests'
        # order (frontdoor/stream_calls.py), and a unary call has one answer.
        handled = {"max_queue_delay_microseconds", "default_queue_policy", "preferred_batch_size",
                   "priority_levels", "default_priority_level", "preserve_ordering",
                   "priority_queue_policy"}  # fmt: skip
        for key in sorted(set(block) - handled):
            out.warnings.append(f"{PBTXT_FILE}: dynamic_batching.{key} is not supported")


def _queue_policy(policy: Any, where: str, out: TritonConfig) -> dict[str, Any]:
    """A ModelQueuePolicy as settings of a model (or of a level: LevelPolicy): its
    cap on waiting requests and its timeout in milliseconds where set, and, as in
    Triton, its timeout action (REJECT unless set) and whether a request's timeout
    may shorten it (not unless set: proto3 cannot tell a false from no value)."""
    policy = policy if isinstance(policy, dict) else {}
    settings: dict[str, Any] = {}
    if int(one(policy, "max_queue_size", 0)) > 0:
        settings["max_queue_size"] = int(one(policy, "max_queue_size", 0))
    timeout_us = int(one(policy, "default_timeout_microseconds", 0))
    if timeout_us > 0:
        settings["timeout_ms"] = max(1, timeout_us // 1000)
    settings["timeout_action"] = str(one(policy, "timeout_action", "REJECT")).lower()
    settings["allow_timeout_override"] = bool(one(policy, "allow_timeout_override", False))
    known = {"max_queue_size", "default_timeout_microseconds", "timeout_action",
             "allow_timeout_override"}  # fmt: skip
    for key in sorted(set(policy) - known):
        out.warnings.append(f"{PBTXT_FILE}: dynamic_batching.{where}.{key} is not supported")
    return settings


def _sequence_batching(blocks: list[Any], out: TritonConfig) -> None:
    """The sequence batcher's own batching delay (it stands for dynamic_batching's in
    a stateful model), and every field of the block that is not acted on, named."""
    for block in blocks:
        for key in sorted(set(block) - SEQUENCE_FIELDS):
            out.warnings.append(f"{PBTXT_FILE}: sequence_batching.{key} is not supported")
        for state in block.get("state", []):
            for key in sorted(set(state) - STATE_FIELDS):
                out.warnings.append(f"{PBTXT_FILE}: sequence_batching.state.{key} is not supported")
        for strategy in ("direct", "oldest"):
            for options in block.get(strategy, []):
                if "max_queue_delay_microseconds" in options:
                    delay = int(one(options, "max_queue_delay_microseconds", 0))
                    out.settings["max_queue_delay_us"] = delay
                if strategy == "oldest" and options.get("preferred_batch_size"):
                    sizes = [int(n) for n in options["preferred_batch_size"]]
                    out.settings["preferred_batch_sizes"] = sizes
                # The slots are counted (sequence_config.py); a batch takes what is
                # queued of the slotted sequences (the oldest strategy's preferred sizes
                # as the dynamic batcher's), with no slot utilization.
                used = {"max_queue_delay_microseconds", "max_candidate_sequences"}
                if strategy == "oldest":
                    used.add("preferred_batch_size")
                for key in sorted(set(options) - used):
                    out.warnings.append(
                        f"{PBTXT_FILE}: sequence_batching.{strategy}.{key} is not used: "
                        "a batch takes what is queued, one request of a sequence at a time"
                    )


def response_cache(data: Message) -> bool:
    """Whether a parsed config enables the response cache (`response_cache.enable`);
    a model's and an ensemble's alike."""
    return any(bool(one(block, "enable", False)) for block in data.get("response_cache", []))


def _instances(groups: list[Any], out: TritonConfig) -> None:
    if not groups:
        return
    total = 0
    limits: list[tuple[dict[str, int], int]] = []
    for group in groups:
        total += max(1, int(one(group, "count", 1)))
        kind = str(one(group, "kind", "KIND_AUTO"))
        out.kinds.add(kind)
        if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
            out.warnings.append(f"{PBTXT_FILE}: instance_group kind {kind} is served as KIND_AUTO")
        for key in sorted(set(group) - {"count", "kind", "name", "rate_limiter"}):
            out.warnings.append(
                f"{PBTXT_FILE}: instance_group.{key} is not supported (the agent's execution "
                "provider and device decide where instances run)"
            )
        limits.append(_rate_limiter(one(group, "rate_limiter", {})))
    if total > 16:
        out.warnings.append(f"{PBTXT_FILE}: instance_group asks for {total} instances; 16 at most")
    out.settings["instance_count"] = min(16, total)
    resources: dict[str, int] = {}
    for need, _ in limits:
        for name, count in need.items():
            resources[name] = max(resources.get(name, 0), count)
    if resources:
        out.settings["rate_limit_resources"] = resources
        out.settings["rate_limit_priority"] = min(priority for _, priority in limits)
    if len(set(map(repr, limits))) > 1:
        out.warnings.append(
            f"{PBTXT_FILE}: instance groups with different rate limiters are served as one: "
            "each resource's largest count, and the highest priority (the lowest number)"
        )


def _rate_limiter(block: Message) -> tuple[dict[str, int], int]:
    """An instance group's `rate_limiter`: its resources by name (global or per device
    alike: an agent serves one device) and its priority (0, unset, counts as 1)."""
    resources: dict[str, int] = {}
    for resource in block.get("resources", []):
        name = str(one(resource, "name", ""))
        count = int(one(resource, "count", 0))
        if not name or count < 1:
            raise ValueError(
                f"{PBTXT_FILE}: instance_group.rate_limiter: a resource needs a name and a "
                f"count of at least 1 (got name {name!r}, count {count})"
            )
        resources[name] = resources.get(name, 0) + count
    return resources, max(1, int(one(block, "priority", 0)))


def _versions(blocks: list[Any], out: TritonConfig) -> None:
    for block in blocks:
        if "all" in block:
            out.version_policy = VersionPolicy("all")
        elif "specific" in block:
            versions = tuple(int(v) for s in block["specific"] for v in s.get("versions", []))
            out.version_policy = VersionPolicy("specific", versions=versions)
        elif "latest" in block:
            count = int(one(block["latest"][-1], "num_versions", 1))
            out.version_policy = VersionPolicy("latest", count=max(1, count))


def _parameters(entries: list[Any], out: TritonConfig) -> None:
    """The onnxruntime backend's parameters: intra_op_thread_count is the model's
    intra_op_threads, arena_extend_strategy its gpu_arena; the rest of those known go
    to ONNX Runtime as they are (ort_parameters.py)."""
    for entry in entries:
        key = str(one(entry, "key", ""))
        value = one(entry, "value", {})
        text = str(one(value, "string_value", "")) if isinstance(value, dict) else ""
        if key in _PARAMETERS:
            try:
                out.settings[_PARAMETERS[key]] = int(text)
            except ValueError:
                raise ValueError(
                    f"{PBTXT_FILE}: parameters '{key}': not an integer: {text!r}"
                ) from None
        elif key == "arena_extend_strategy":
            out.settings["gpu_arena"] = ort_parameters.ARENAS[
                ort_parameters.checked(key, text, PBTXT_FILE)
            ]
        elif ort_parameters.known(key):
            out.ort_parameters[key] = ort_parameters.checked(key, text, PBTXT_FILE)
        else:
            out.warnings.append(f"{PBTXT_FILE}: parameters '{key}' is not supported")


def _optimization(blocks: list[Any], out: TritonConfig) -> None:
    """`optimization`: its `graph.level` is the level ONNX Runtime optimizes the graph
    at (ort_parameters.py); every other field is named in a warning."""
    if not blocks:
        return
    block = blocks[-1]
    for key in sorted(set(block) - {"graph"}):
        out.warnings.append(f"{PBTXT_FILE}: optimization.{key} is not supported and has no effect")
    graph = (block.get("graph") or [{}])[-1]
    if "level" in graph:
        level = str(one(graph, "level", 0))
        key = ort_parameters.GRAPH_LEVEL
        out.ort_parameters[key] = ort_parameters.checked(key, level, PBTXT_FILE)


def config_json(entry: ModelRecord) -> dict[str, Any]:
    """A model's configuration as Triton's model config endpoint returns it (JSON),
    with edgeplex's own settings under `edgeplex`."""

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "data_type": triton_type(t.datatype),
                "dims": list(t.shape[1:] if entry.max_batch_size else t.shape),
            }
            for t in specs
        ]

    config = entry.config
    out: dict[str, Any] = {
        "name": entry.name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": entry.max_batch_size,
        "input": tensors(entry.inputs),
        "output": tensors(entry.outputs),
    }
    labelled = {t.name: t.label_file for t in entry.source.declared_outputs if t.label_file}
    for output in out["output"]:
        if output["name"] in labelled:
            output["label_filename"] = labelled[output["name"]]
    declared = (*entry.source.declared_inputs, *entry.source.declared_outputs)
    reshaped = {t.name: t.reshape for t in declared if t.reshape is not None}
    for tensor in (*out["input"], *out["output"]):
        if tensor["name"] in reshaped:
            tensor["reshape"] = {"shape": list(reshaped[tensor["name"]])}
    layouts = {t.name: t.format for t in entry.source.declared_inputs}
    optional = {t.name for t in entry.inputs if t.optional}
    for tensor in out["input"]:  # as Triton's: always there, for clients that read them
        tensor["format"] = layouts.get(tensor["name"], "FORMAT_NONE")
        tensor["optional"] = tensor["name"] in optional
    sequence = entry.source.sequence
    if sequence is not None:  # a stateful model: the one batcher Triton gives it
        out["sequence_batching"] = sequence.config_json(
            config.max_queue_delay_us, config.preferred_batch_sizes
        )
    else:
        out["dynamic_batching"] = {
            "preferred_batch_size": config.preferred_batch_sizes,
            "priority_levels": config.priority_levels,
            "default_priority_level": config.default_priority_level,
            "max_queue_delay_microseconds": config.max_queue_delay_us,
            "default_queue_policy": {
                "max_queue_size": config.max_queue_size,
                "default_timeout_microseconds": config.timeout_ms * 1000,
                "timeout_action": config.timeout_action.upper(),
                "allow_timeout_override": config.allow_timeout_override,
            },
        }
        if config.priority_queue_policy:  # map keys are strings in protobuf's JSON
            out["dynamic_batching"]["priority_queue_policy"] = {
                str(level): _level_policy_json(config, level, policy)
                for level, policy in sorted(config.priority_queue_policy.items())
            }
    group: dict[str, Any] = {"count": config.instance_count, "kind": "KIND_AUTO"}
    if config.rate_limit_resources:
        group["rate_limiter"] = {
            "resources": [
                {"name": name, "count": count}
                for name, count in sorted(config.rate_limit_resources.items())
            ],
            "priority": config.rate_limit_priority,
        }
    out["instance_group"] = [group]
    out["response_cache"] = {"enable": config.response_cache}
    level = dict(entry.source.ort_parameters).get(ort_parameters.GRAPH_LEVEL)
    if level is not None:
        out["optimization"] = {"graph": {"level": int(level)}}
    if entry.source.warmup:
        out["model_warmup"] = [sample.config_json() for sample in entry.source.warmup]
    out["edgeplex"] = config.model_dump()
    return out


def _level_policy_json(config: ModelConfig, level: int, policy: LevelPolicy) -> dict[str, Any]:
    """A level's queue policy as Triton's JSON has it: its own cap (0: none of its
    own), and the timeout, action and override its requests get (its own, else the
    model's)."""
    timeout_ms, delay, override = config.queue_policy(level)
    return {
        "max_queue_size": policy.max_queue_size or 0,
        "default_timeout_microseconds": timeout_ms * 1000,
        "timeout_action": "DELAY" if delay else "REJECT",
        "allow_timeout_override": override,
    }
