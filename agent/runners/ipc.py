"""Typed messages between the agent, the zygote and the runners. No pickle.

One small class per message, registered under a type tag; a header decodes
only into these classes (framing.py carries them). Both ends share this
module, so a peer can send nothing but data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar, dataclass_transform

import numpy as np

FRAME_HEAD = struct.Struct("<II")
MAX_HEADER_BYTES = 1 * 1024 * 1024
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024 * 1024

TENSOR_DTYPES = frozenset(
    np.dtype(t).str
    for t in ("?", "u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "<f2", "<f4", "<f8")
)


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame or message."""


# --- messages -----------------------------------------------------------------------------

_REGISTRY: dict[str, type[Message]] = {}
M = TypeVar("M", bound="Message")


@dataclass(slots=True)
class Message:
    TAG: ClassVar[str] = ""

    def to_header(self) -> dict[str, Any]:
        header = {f.name: getattr(self, f.name) for f in fields(self)}
        header["t"] = self.TAG
        return header


@dataclass_transform(field_specifiers=(field,))
def _message(cls: type[M]) -> type[M]:
    """Class decorator: a slotted dataclass registered under its TAG."""
    made = dataclass(slots=True)(cls)
    _REGISTRY[made.TAG] = made
    return made


def message_from_header(header: Any) -> Message:
    if not isinstance(header, dict) or header.get("t") not in _REGISTRY:
        raise ProtocolError("unknown message")
    cls = _REGISTRY[header.pop("t")]
    try:
        return cls(**header)
    except TypeError as exc:
        raise ProtocolError(f"bad {cls.TAG} message: {exc}") from None


@_message
class Hello(Message):
    """runner -> agent, first frame on a new connection."""

    TAG: ClassVar[str] = "hello"
    runner_id: str
    pid: int  # as the agent sees it (the runner is PID 1 in its own namespace)
    # Each sandbox layer (sandbox.LAYERS): "on", or why this runner runs without it.
    sandbox: dict[str, str] = field(default_factory=dict)
    sandbox_us: dict[str, int] = field(default_factory=dict)  # what each layer took


@_message
class LoadModel(Message):
    """agent -> runner: create a session. Answered by ModelLoaded or Failure."""

    TAG: ClassVar[str] = "load"
    req_id: int
    model: str
    # The verified model file (cached tier).
    path: str
    # Where the pre-optimized copy lives (staged tier, in host RAM): used when it
    # exists, else written from `path` first.
    staged_dir: str
    intra_op_threads: int
    inter_op_threads: int
    allow_spinning: bool
    prepack_weights: bool
    # "cpu" or "cuda"; with cuda, memory_limit (bytes, 0 = none) caps the arena.
    provider: str
    device_id: int
    memory_limit: int
    # Worker threads that may run this model's batches concurrently.
    instances: int
    # Run once on synthetic inputs before answering. Skipped for a promotion that
    # requests wait for: their first batch does the same work, and sooner.
    warm_up: bool = True
    # With warm_up, the model's own warm-up samples (config.pbtxt's model_warmup) in
    # place of the synthetic run: each [name, runs, tensor descriptors], their tensors
    # in the frame's payload, back to back. A sample that fails fails the load.
    warmup: list[list[Any]] = field(default_factory=list)
    # Seconds the samples may take in all (0: no limit): the agent gives up on the
    # load then, and the runner's one loader must not stay busy with it.
    warmup_s: float = 0.0
    # config.pbtxt's `reshape`: the inputs to reshape for the graph (name: the graph's
    # dims) and the outputs to reshape for clients (name: their dims); without the
    # batch dimension when `batched`, which every array then keeps first.
    reshape_inputs: dict[str, list[int]] = field(default_factory=dict)
    reshape_outputs: dict[str, list[int]] = field(default_factory=dict)
    batched: bool = False
    # config.pbtxt's onnxruntime parameters, as ORT names them: session options
    # (execution_mode, enable_mem_arena, enable_mem_pattern) and CUDA provider options.
    ort_session: dict[str, str] = field(default_factory=dict)
    cuda_options: dict[str, str] = field(default_factory=dict)
    # The form `path` holds ("" as shipped, "int8", "fp16"), named in each result.
    form: str = ""
    # Swap the session of a model loaded now (its form changes while it serves);
    # answered with Failure "not_loaded" when the model left meanwhile.
    swap: bool = False
    # With provider cuda: serve on the CPU when CUDA cannot run the session (else
    # the load fails), and how the CUDA arena grows (ORT's arena_extend_strategy).
    cpu_fallback: bool = False
    arena: str = "kSameAsRequested"
    # A CPU session without prepacking takes its weights from the runner's kept
    # mapping of the staged copy (staged_weights.py) instead of mapping it anew.
    mapped_weights: bool = True
    # ... and, with mapped_weights, runs on the one session of its weightless graph
    # that every model with the same graph shares (shared_graphs.py).
    share_graphs: bool = True
    # The level a cached model's graph is optimized at as it is staged: disabled,
    # basic or extended (config.pbtxt's optimization.graph.level).
    graph_level: str = "extended"


@_message
class ModelLoaded(Message):
    TAG: ClassVar[str] = "loaded"
    req_id: int
    model: str
    # [name, ORT type string, shape with -1 for dynamic dims]
    inputs: list[list[Any]]
    outputs: list[list[Any]]
    # Growth of the runner's resident memory across session creation and warm-up.
    bytes: int
    load_ms: float
    # Tier the load started from ("staged" or "cached") and its stages in ms:
    # read, optimize, create, warmup.
    source: str
    stages: dict[str, float]
    # Bytes of the staged copy (graph + weights) in host RAM.
    staged_bytes: int
    # Whether the session was created with prepacked weights.
    prepacked: bool
    # The execution provider the session runs on ("cpu" or "cuda").
    provider: str = "cpu"
    # Whether it runs on the session its graph shares with others (shared_graphs.py).
    shared: bool = False


@_message
class StageModel(Message):
    """agent -> runner: cached -> staged only (no session). Answered by ModelStaged
    or Failure. Runs on its own thread, so promotions never queue behind it."""

    TAG: ClassVar[str] = "stage"
    req_id: int
    model: str
    path: str
    staged_dir: str
    # The graph is optimized for the provider that will run it ("cpu" or "cuda"),
    # at the model's level (LoadModel.graph_level).
    provider: str = "cpu"
    device_id: int = 0
    graph_level: str = "extended"


@_message
class ModelStaged(Message):
    TAG: ClassVar[str] = "staged"
    req_id: int
    staged_bytes: int
    stages: dict[str, float]


@_message
class BuildVariants(Message):
    """agent -> runner: build (or find) `forms` of the model at `path` in the store at
    `root`, and run each against the original. Answered by VariantsBuilt or Failure.
    `calibration` and `guard` are the model config's, as JSON-ready dicts."""

    TAG: ClassVar[str] = "build_variants"
    req_id: int
    model: str
    path: str
    sha256: str
    root: str
    forms: list[str]
    calibration: dict[str, Any]
    guard: dict[str, Any]


@_message
class VariantsBuilt(Message):
    TAG: ClassVar[str] = "variants_built"
    req_id: int
    # One forms.VariantReport per form, as a dict.
    reports: list[dict[str, Any]]


@_message
class Prepack(Message):
    """agent -> runner: rebuild `model`'s session with ORT's weight prepacking and swap
    it in (the model keeps serving meanwhile). Answered by Prepacked or Failure."""

    TAG: ClassVar[str] = "prepack"
    req_id: int
    model: str


@_message
class Prepacked(Message):
    TAG: ClassVar[str] = "prepacked"
    req_id: int
    # Change of what the model holds across the swap (may be negative): the device's
    # measured growth on CUDA, 0 on the CPU (runners/prepack.py).
    bytes_delta: int
    ms: float


@_message
class SetInstances(Message):
    """agent -> runner: run `model` on this many worker threads. Answered by
    InstancesSet."""

    TAG: ClassVar[str] = "instances"
    req_id: int
    model: str
    instances: int


@_message
class InstancesSet(Message):
    TAG: ClassVar[str] = "instances_set"
    req_id: int
    instances: int


@_message
class SetLogLevel(Message):
    """agent -> runner: log at `level` from now on (a logging level's name, or its
    number). Answered by LogLevelSet."""

    TAG: ClassVar[str] = "log_level"
    req_id: int
    level: str


@_message
class LogLevelSet(Message):
    TAG: ClassVar[str] = "log_level_set"
    req_id: int


@_message
class UnloadModel(Message):
    TAG: ClassVar[str] = "unload"
    req_id: int
    model: str


@_message
class Unloaded(Message):
    TAG: ClassVar[str] = "unloaded"
    req_id: int


@_message
class Infer(Message):
    """agent -> runner: run one (batched) execution; tensors travel in the payload."""

    TAG: ClassVar[str] = "infer"
    req_id: int
    model: str
    outputs: list[str] | None
    tensors: list[list[Any]] = field(default_factory=list)
    # Where the tensors lie in the shared request ring (at < 0: in the payload),
    # and how far the agent has read the result ring (shm.py).
    at: int = -1
    size: int = 0
    consumed: int = 0
    # No other batch was in flight when the agent sent this one: with little load
    # the next batch follows soon, and the runner may poll for it (idle_spin.py).
    lone: bool = False


@_message
class InferResult(Message):
    TAG: ClassVar[str] = "result"
    req_id: int
    compute_ns: int
    tensors: list[list[Any]] = field(default_factory=list)
    form: str = ""  # the form of the session that ran it
    at: int = -1  # where the tensors lie in the shared result ring (< 0: in the payload)
    size: int = 0


@_message
class AttachShm(Message):
    """agent -> runner: map the shared tensor rings at `path` (shm.py). Answered by
    ShmAttached or Failure; the agent unlinks the file once answered."""

    TAG: ClassVar[str] = "attach_shm"
    req_id: int
    path: str
    request_bytes: int
    result_bytes: int
    threshold: int


@_message
class ShmAttached(Message):
    TAG: ClassVar[str] = "shm_attached"
    req_id: int


@_message
class Failure(Message):
    """runner -> agent: the request `req_id` failed. kind: invalid | internal | not_loaded."""

    TAG: ClassVar[str] = "failure"
    req_id: int
    kind: str
    message: str


@_message
class SpawnRunner(Message):
    """agent -> zygote: fork a runner that connects to `socket_path`."""

    TAG: ClassVar[str] = "spawn"
    runner_id: str
    socket_path: str
    log_level: str
    # RLIMIT_AS the child sets on itself before it starts (0 = none).
    rlimit_as: int
    log_format: str = "text"
    # How long the runner polls for its next frame before it blocks (idle_spin.py).
    idle_spin_us: int = 0
    # The sandbox (sandbox.py): "off", "best_effort" or "required", and its mount view:
    # paths bound read-only, writable, device nodes, and secrets masked if under one.
    sandbox: str = "off"
    read_only: list[str] = field(default_factory=list)
    writable: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    max_open_files: int = 0
    # cgroup.procs files the zygote writes the child's pid into before it runs.
    cgroups: list[str] = field(default_factory=list)
    # No runner: whether CUDA initialises in a runner sandboxed as this says (the
    # zygote answers with a SandboxReport of {"cuda": "on" or why not}).
    probe_cuda: bool = False


@_message
class SandboxReport(Message):
    """zygote -> agent, its first frame: what a sandboxed runner gets on this host
    (a probe child applied every layer), {layer: "on" or why not}."""

    TAG: ClassVar[str] = "sandbox"
    layers: dict[str, str]


@_message
class RunnerSpawned(Message):
    TAG: ClassVar[str] = "spawned"
    runner_id: str
    pid: int


@_message
class RunnerExited(Message):
    """zygote -> agent: a runner process ended; `status` as os.waitstatus_to_exitcode."""

    TAG: ClassVar[str] = "exited"
    runner_id: str
    pid: int
    status: int


@_message
class KillRunner(Message):
    """agent -> zygote: send `signal` to a runner (used on shutdown and when stuck)."""

    TAG: ClassVar[str] = "kill"
    runner_id: str
    signal: int
