"""Triton's onnxruntime backend `parameters` in config.pbtxt, as edgeplex passes them to
ONNX Runtime: session options for every session, CUDA provider options where the
runners use CUDA (on the CPU they are kept and have no effect, as in Triton's CPU
instances). Values are strings, as Triton's are, checked when the model is found;
the runner sets them (agent/runners/sessions.py).

| parameter | ONNX Runtime |
| --- | --- |
| `inter_op_thread_count` | the session's inter-op threads |
| `execution_mode` (0 sequential, 1 parallel) | `SessionOptions.execution_mode` |
| `enable_mem_arena` (0, 1) | `SessionOptions.enable_cpu_mem_arena` |
| `enable_mem_pattern` (0, 1) | `SessionOptions.enable_mem_pattern` |
| `arena_extend_strategy` (0 next power of two, 1 as requested) | the model's `gpu_arena` |
| `gpu_mem_limit` (bytes) | CUDA `gpu_mem_limit`, in place of `memory_limit`'s |
| `cudnn_conv_algo_search` (0 exhaustive, 1 heuristic, 2 default) | CUDA's, by name |
| `cudnn_conv_use_max_workspace`, `do_copy_in_default_stream` (0, 1) | CUDA's |

`intra_op_thread_count` is the model's `intra_op_threads` (triton_config.py).

`optimization { graph { level } }` is kept beside them (GRAPH_LEVEL): the level at
which ONNX Runtime optimizes the model's graph when it stages it, the one time
the graph is optimized (runners/sessions.py): -1 basic, 1 extended, 2 none. 0, or
none set, is edgeplex's own, extended: the staged copy is saved, and the layout
changes of ORT's "all" are for one machine's kernels.
"""

from __future__ import annotations

# Each parameter acted on: the values it takes (None: a count, 1 or more).
SESSION: dict[str, tuple[str, ...] | None] = {
    "inter_op_thread_count": None,
    "execution_mode": ("0", "1"),
    "enable_mem_arena": ("0", "1"),
    "enable_mem_pattern": ("0", "1"),
}
CUDA: dict[str, tuple[str, ...] | None] = {
    "gpu_mem_limit": None,
    "cudnn_conv_algo_search": ("0", "1", "2"),
    "cudnn_conv_use_max_workspace": ("0", "1"),
    "do_copy_in_default_stream": ("0", "1"),
}
ARENAS = {"0": "next_power_of_two", "1": "same_as_requested"}  # arena_extend_strategy
GRAPH_LEVEL = "optimization.graph.level"
GRAPH_LEVELS = {"-1": "basic", "0": "extended", "1": "extended", "2": "disabled"}
DEFAULT_GRAPH_LEVEL = "extended"
CONV_SEARCH = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")


def known(key: str) -> bool:
    return key in SESSION or key in CUDA or key == "arena_extend_strategy"


def checked(key: str, text: str, where: str) -> str:
    """`text` as the value of the known parameter `key`; ValueError naming it (with
    `where`, the file) for a value the parameter does not take."""
    if key == "arena_extend_strategy":
        allowed: tuple[str, ...] | None = tuple(ARENAS)
    elif key == GRAPH_LEVEL:
        allowed = tuple(GRAPH_LEVELS)
    else:
        allowed = SESSION[key] if key in SESSION else CUDA[key]
    value = text.strip()
    if allowed is None:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{where}: parameters '{key}': not a count: {text!r}")
        return str(int(value))
    if value not in allowed:
        what = key if key == GRAPH_LEVEL else f"parameters '{key}'"
        raise ValueError(f"{where}: {what}: {text!r} is not one of {', '.join(allowed)}")
    return value


def for_runner(parameters: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Checked `parameters` as a load carries them to its runner: the session options
    (execution_mode, enable_mem_arena, enable_mem_pattern; "0" or "1") and the CUDA
    provider's options, named and valued as ORT takes them."""
    session = {k: v for k, v in parameters.items() if k in SESSION and k != "inter_op_thread_count"}
    cuda = {k: v for k, v in parameters.items() if k in CUDA}
    if "cudnn_conv_algo_search" in cuda:
        cuda["cudnn_conv_algo_search"] = CONV_SEARCH[int(cuda["cudnn_conv_algo_search"])]
    return session, cuda


def graph_level(parameters: dict[str, str]) -> str:
    """The level the model's graph is optimized at when staged: disabled, basic or
    extended (ONNX Runtime's names, less ORT_ENABLE_)."""
    return GRAPH_LEVELS[parameters.get(GRAPH_LEVEL, "0")]
