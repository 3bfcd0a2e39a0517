"""Triton's `config.pbtxt`, read as an edgeplex model config.

A Triton model repository works unchanged: `<repo>/<model>/config.pbtxt` is
parsed as protobuf text format against the fields of Triton's `ModelConfig`
that edgeplex acts on, and every other field that is set is named in a
warning (logged, and in the model's status), never dropped silently:

| config.pbtxt | edgeplex |
| --- | --- |
| `name` | must match the model's directory |
| `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"` | required when set |
| `max_batch_size` | `max_batch_size` (dims then leave out the batch dimension) |
| `input`, `output` (`name`, `data_type`, `dims`) | checked against the graph |
| `dynamic_batching.max_queue_delay_microseconds` | `max_queue_delay_us` |
| `dynamic_batching.default_queue_policy` | `max_queue_size`, `timeout_ms` |
| `instance_group` (`count`, `kind`) | `instance_count` (summed over groups) |
| `version_policy` (`latest`, `all`, `specific`) | which versions are served |
| `parameters { key: "intra_op_thread_count" ... }` | `intra_op_threads` |

A `config.yaml` beside it is laid over what `config.pbtxt` says: the
edgeplex-native file wins field by field (docs/architecture.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeplex.agent.residency.state import ModelRecord

PBTXT_FILE = "config.pbtxt"

Message = dict[str, list[Any]]  # a field may repeat: every value is a list


class PbtxtError(ValueError):
    pass


_TOKEN = re.compile(
    r"""(?P<skip>\s+|\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?))
      | (?P<ident>[-+]?[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<punct>[{}\[\]:,;<>])""",
    re.VERBOSE,
)
_CLOSE = {"{": "}", "<": ">"}


def parse_pbtxt(text: str) -> Message:
    """Protobuf text format as nested {field: [values]}; raises PbtxtError naming
    the line of the first thing it cannot read."""
    tokens: list[tuple[str, str, int]] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PbtxtError(f"line {line}: unexpected {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind != "skip":
            tokens.append((kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    parser = _Parser(tokens)
    message = parser.message(closing=None)
    return message


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, int]]) -> None:
        self.tokens, self.i = tokens, 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            raise PbtxtError(
                f"unexpected end of file{f', expected {expected!r}' if expected else ''}"
            )
        if expected is not None and token[1] != expected:
            raise PbtxtError(f"line {token[2]}: expected {expected!r}, found {token[1]!r}")
        self.i += 1
        return token

    def message(self, closing: str | None) -> Message:
        out: Message = {}
        while True:
            token = self.peek()
            if token is None:
                if closing is not None:
                    raise PbtxtError(f"unexpected end of file, expected {closing!r}")
                return out
            if closing is not None and token[1] == closing:
                self.i += 1
                return out
            kind, name, line = self.take()
            if kind != "ident":
                raise PbtxtError(f"line {line}: expected a field name, found {name!r}")
            out.setdefault(name, []).extend(self.field_values())
            nxt = self.peek()
            if nxt is not None and nxt[1] in (",", ";"):
                self.i += 1

    def field_values(self) -> list[Any]:
        token = self.peek()
        if token is not None and token[1] == ":":
            self.i += 1
            token = self.peek()
        if token is not None and token[1] == "[":
            self.i += 1
            values: list[Any] = []
            while True:
                nxt = self.peek()
                if nxt is not None and nxt[1] == "]":
                    self.i += 1
                    return values
                values.append(self.value())
                nxt = self.peek()
                if nxt is not None and nxt[1] == ",":
                    self.i += 1
        return [self.value()]

    def value(self) -> Any:
        kind, text, line = self.take()
        if text in _CLOSE:
            return self.message(_CLOSE[text])
        if kind == "string":
            parts = [_unquote(text)]
            while (nxt := self.peek()) is not None and nxt[0] == "string":  # "a" "b" joins
                parts.append(_unquote(self.take()[1]))
            return "".join(parts)
        if kind == "number":
            body = text.rstrip("fF") if not text.lower().startswith(("0x", "-0x")) else text
            try:
                return (
                    int(body, 0)
                    if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|\d+)", body)
                    else float(body)
                )
            except ValueError:
                raise PbtxtError(f"line {line}: not a number: {text!r}") from None
        if kind == "ident":
            lowered = text.lower()
            if lowered in ("true", "t"):
                return True
            if lowered in ("false", "f"):
                return False
            if lowered.lstrip("+-") in ("inf", "infinity", "nan"):
                return float(lowered)
            return text  # an enum value
        raise PbtxtError(f"line {line}: expected a value, found {text!r}")


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape")


# --- the mapping ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeclaredTensor:
    name: str
    datatype: str  # OIP name: FP32, BYTES, ...
    dims: tuple[int, ...]  # without the batch dimension when max_batch_size > 0


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


_TRITON_TYPES = {
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "STRING", "BF16",
}  # fmt: skip
SUPPORTED_PLATFORMS = ("onnxruntime_onnx",)
SUPPORTED_BACKENDS = ("onnxruntime",)
_PARAMETERS = {"intra_op_thread_count": "intra_op_threads"}
_HANDLED = {
    "name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching",
    "instance_group", "version_policy", "parameters",
}  # fmt: skip


def read_triton_config(path: Path, model: str) -> TritonConfig:
    """`config.pbtxt` at `path` for the model directory `model`. Raises ValueError
    (with the file's name) for what cannot be served as written."""
    try:
        data = parse_pbtxt(path.read_text())
    except (OSError, UnicodeDecodeError, PbtxtError) as exc:
        raise ValueError(f"{PBTXT_FILE}: {exc}") from None
    out = TritonConfig()
    name = _one(data, "name", "")
    if name and name != model:
        raise ValueError(
            f"{PBTXT_FILE}: name {name!r} does not match the model's directory {model!r}"
        )
    platform, backend = _one(data, "platform", ""), _one(data, "backend", "")
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
    if "max_batch_size" in data:
        out.settings["max_batch_size"] = int(_one(data, "max_batch_size", 0))
    out.inputs = tuple(_tensor(t, "input", out.warnings) for t in data.get("input", []))
    out.outputs = tuple(_tensor(t, "output", out.warnings) for t in data.get("output", []))
    _batching(data.get("dynamic_batching", []), out)
    _instances(data.get("instance_group", []), out)
    _versions(data.get("version_policy", []), out)
    _parameters(data.get("parameters", []), out)
    return out


def _one(message: Message, key: str, default: Any) -> Any:
    values = message.get(key, [])
    return values[-1] if values else default


def _tensor(message: Any, what: str, warnings: list[str]) -> DeclaredTensor:
    if not isinstance(message, dict) or not _one(message, "name", ""):
        raise ValueError(f"{PBTXT_FILE}: every {what} needs a name")
    name = str(_one(message, "name", ""))
    data_type = str(_one(message, "data_type", "TYPE_INVALID"))
    if data_type.removeprefix("TYPE_") not in _TRITON_TYPES:
        raise ValueError(
            f"{PBTXT_FILE}: {what} '{name}': data_type {data_type!r} is not a Triton type"
        )
    datatype = "BYTES" if data_type == "TYPE_STRING" else data_type.removeprefix("TYPE_")
    for key in sorted(set(message) - {"name", "data_type", "dims"}):
        warnings.append(
            f"{PBTXT_FILE}: {what} '{name}': '{key}' is not supported and has no effect"
        )
    return DeclaredTensor(name, datatype, tuple(int(d) for d in message.get("dims", [])))


def _batching(blocks: list[Any], out: TritonConfig) -> None:
    for block in blocks:
        if "max_queue_delay_microseconds" in block:
            out.settings["max_queue_delay_us"] = int(_one(block, "max_queue_delay_microseconds", 0))
        for policy in block.get("default_queue_policy", []):
            if int(_one(policy, "max_queue_size", 0)) > 0:
                out.settings["max_queue_size"] = int(_one(policy, "max_queue_size", 0))
            timeout_us = int(_one(policy, "default_timeout_microseconds", 0))
            if timeout_us > 0:
                out.settings["timeout_ms"] = max(1, timeout_us // 1000)
            for key in sorted(set(policy) - {"max_queue_size", "default_timeout_microseconds"}):
                out.warnings.append(
                    f"{PBTXT_FILE}: dynamic_batching.default_queue_policy.{key} is not supported"
                )
        if block.get("preferred_batch_size"):
            out.warnings.append(
                f"{PBTXT_FILE}: dynamic_batching.preferred_batch_size is not used: a batch takes "
                "what is queued, up to max_batch_size"
            )
        handled = {"max_queue_delay_microseconds", "default_queue_policy", "preferred_batch_size"}
        for key in sorted(set(block) - handled):
            out.warnings.append(f"{PBTXT_FILE}: dynamic_batching.{key} is not supported")


def _instances(groups: list[Any], out: TritonConfig) -> None:
    if not groups:
        return
    total = 0
    for group in groups:
        total += max(1, int(_one(group, "count", 1)))
        kind = str(_one(group, "kind", "KIND_AUTO"))
        if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
            out.warnings.append(f"{PBTXT_FILE}: instance_group kind {kind} is served as KIND_AUTO")
        for key in sorted(set(group) - {"count", "kind", "name"}):
            out.warnings.append(
                f"{PBTXT_FILE}: instance_group.{key} is not supported (the agent's execution "
                "provider and device decide where instances run)"
            )
    if total > 16:
        out.warnings.append(f"{PBTXT_FILE}: instance_group asks for {total} instances; 16 at most")
    out.settings["instance_count"] = min(16, total)


def _versions(blocks: list[Any], out: TritonConfig) -> None:
    for block in blocks:
        if "all" in block:
            out.version_policy = VersionPolicy("all")
        elif "specific" in block:
            versions = tuple(int(v) for s in block["specific"] for v in s.get("versions", []))
            out.version_policy = VersionPolicy("specific", versions=versions)
        elif "latest" in block:
            count = int(_one(block["latest"][-1], "num_versions", 1))
            out.version_policy = VersionPolicy("latest", count=max(1, count))


def _parameters(entries: list[Any], out: TritonConfig) -> None:
    for entry in entries:
        key = str(_one(entry, "key", ""))
        value = _one(entry, "value", {})
        text = str(_one(value, "string_value", "")) if isinstance(value, dict) else ""
        if key in _PARAMETERS:
            try:
                out.settings[_PARAMETERS[key]] = int(text)
            except ValueError:
                raise ValueError(
                    f"{PBTXT_FILE}: parameters '{key}': not an integer: {text!r}"
                ) from None
        else:
            out.warnings.append(f"{PBTXT_FILE}: parameters '{key}' is not supported")


def config_json(entry: ModelRecord) -> dict[str, Any]:
    """A model's configuration as Triton's model config endpoint returns it (JSON),
    with edgeplex's own settings under `edgeplex`."""

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                "dims": list(t.shape[1:] if entry.max_batch_size else t.shape),
            }
            for t in specs
        ]

    config = entry.config
    return {
        "name": entry.name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": entry.max_batch_size,
        "input": tensors(entry.inputs),
        "output": tensors(entry.outputs),
        "dynamic_batching": {
            "max_queue_delay_microseconds": config.max_queue_delay_us,
            "default_queue_policy": {
                "max_queue_size": config.max_queue_size,
                "default_timeout_microseconds": config.timeout_ms * 1000,
            },
        },
        "instance_group": [{"count": config.instance_count, "kind": "KIND_AUTO"}],
        "edgeplex": config.model_dump(),
    }
