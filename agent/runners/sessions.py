"""How a runner builds a session: the staged form of a model, the execution
providers, the warm-up run, memory measurement and error scrubbing.

Plain functions, called from the runner's threads; nothing here holds state.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edgeplex.agent.runners import framing, ipc

log = logging.getLogger("edgeplex.runner")

_PAGE = os.sysconf("SC_PAGE_SIZE")
STAGED_MODEL = "model.onnx"
STAGED_WEIGHTS = "weights.bin"


_statm = (-1, -1)  # (pid, descriptor): a forked child must not read its parent's


def resident_bytes() -> int:
    """This process's resident memory: one pread on a descriptor kept open (a load
    reads it twice, and opening /proc under a busy GIL costs more than the read)."""
    global _statm
    pid, fd = _statm
    if pid != os.getpid():
        _statm = pid, fd = os.getpid(), os.open(f"/proc/{os.getpid()}/statm", os.O_RDONLY)
    return int(os.pread(fd, 128, 0).split()[1]) * _PAGE


def providers(request: ipc.LoadModel | ipc.StageModel) -> list[Any]:
    """ONNX Runtime's provider list for a request: CUDA first when asked for (nodes
    it has no kernel for run on the CPU provider, as ORT always places them)."""
    if request.provider != "cuda":
        return ["CPUExecutionProvider"]
    _preload_cuda()
    cuda: dict[str, Any] = {"device_id": request.device_id}
    if isinstance(request, ipc.LoadModel):
        cuda["arena_extend_strategy"] = request.arena
        if request.memory_limit:
            cuda["gpu_mem_limit"] = request.memory_limit
        cuda.update(request.cuda_options)  # config.pbtxt's (its gpu_mem_limit wins)
    return [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]


_preloaded = False


def _preload_cuda() -> None:
    """Load the CUDA and cuDNN libraries of the nvidia-* wheels, when that is how
    they were installed (onnxruntime-gpu finds them only so, or on LD_LIBRARY_PATH)."""
    global _preloaded
    if _preloaded or not hasattr(ort, "preload_dlls"):
        return
    _preloaded = True
    try:
        ort.preload_dlls()
    except Exception as exc:  # the session's own error says more if CUDA is missing
        log.info("CUDA libraries not preloaded: %s", exc)


def served_by(session: ort.InferenceSession) -> str:
    """The provider a session really runs on: ORT drops a provider it cannot use
    (no onnxruntime-gpu, no usable device) and says so only in a warning."""
    return "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"


def no_cuda(model: str) -> str:
    """Why a model asked for CUDA and did not get it, and what to do."""
    available = ", ".join(ort.get_available_providers())
    return (
        f"model '{model}' asked for the CUDA execution provider, but this runner's ONNX "
        f"Runtime {ort.__version__} cannot run it there (available: {available}): install "
        "onnxruntime-gpu with a usable device, or set runner.cpu_fallback to serve it on "
        "the CPU"
    )


# This process's pid as the host sees it (NVML names processes so), set by the
# runner at start: in its own PID namespace os.getpid() is 1.
HOST_PID = 0


def device_bytes() -> int:
    """This process's memory on its GPU (NVML), or resident memory without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        total, used = 0, 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            used += pynvml.nvmlDeviceGetMemoryInfo(handle).used
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == (HOST_PID or os.getpid()) and proc.usedGpuMemory:
                    total += proc.usedGpuMemory
        # In a PID namespace NVML may not list us: fall back to the device-wide
        # reading, exact when this agent is the card's only user.
        return total or used
    except Exception:
        return resident_bytes()


_libc: Any = None


def trim_heap() -> None:
    """Give freed heap pages back to the kernel (glibc), so the next resident-memory
    reading is not hiding a new session inside memory an earlier one left behind."""
    global _libc
    with contextlib.suppress(OSError, AttributeError):
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.malloc_trim(0)


def dims(shape: Any) -> list[int]:
    if shape is None:
        return []
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def directory_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())


GRAPH_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}


def stage_model(
    source: Path,
    staged: Path,
    stages: dict[str, float],
    provider_list: list[Any],
    level: str = "extended",
) -> None:
    """cached -> staged: optimize `source` once, at `level` (GRAPH_LEVELS), for the
    providers that will run it and write the result to `staged` (a directory in host
    RAM) as a small graph plus one external weights file. A graph optimized for one
    provider, or at one level, is kept for that one only: the agent keeps a staged
    copy per provider and level.

    Written to a temporary sibling and renamed, so a reader never sees a partial
    copy, and never modified afterwards: sessions map the weights file, and
    rewriting a mapped file in place would corrupt them (unlinking is safe)."""
    started = time.perf_counter()
    with source.open("rb") as f:  # into the page cache; ORT then reads it from RAM
        while f.read(1 << 24):
            pass
    stages["read"] = ms_since(started)
    started = time.perf_counter()
    # Random: in its own PID namespace every runner is pid 1, and forked alike, its
    # threads can have the same idents as another runner's.
    tmp = staged.with_name(f"{staged.name}.tmp-{secrets.token_hex(8)}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = GRAPH_LEVELS[level]
    options.optimized_model_filepath = str(tmp / STAGED_MODEL)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", STAGED_WEIGHTS
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
    )
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    try:
        # By path, so that models with external data find it next to them.
        ort.InferenceSession(str(source), sess_options=options, providers=provider_list)
        try:
            tmp.rename(staged)
        except OSError:  # staged meanwhile by the other thread: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stages["optimize"] = ms_since(started)


def stage(request: ipc.StageModel) -> ipc.ModelStaged | ipc.Failure:
    """A StageModel answered: the model staged (once: a staged copy is kept as it is),
    or why it could not be."""
    stages: dict[str, float] = {}
    staged = Path(request.staged_dir)
    try:
        if not (staged / STAGED_MODEL).is_file():
            stage_model(Path(request.path), staged, stages, providers(request), request.graph_level)
        return ipc.ModelStaged(request.req_id, directory_bytes(staged), stages)
    except Exception as exc:
        message = scrub(str(exc), request.path, request.staged_dir)
        return ipc.Failure(request.req_id, "load", message)


def session_options(request: ipc.LoadModel) -> ort.SessionOptions:
    """How a promotion's session runs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = request.intra_op_threads
    options.inter_op_num_threads = request.inter_op_threads
    options.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if request.allow_spinning else "0"
    )
    # The staged graph is already optimized, and ORT maps its weights from host
    # RAM itself (external data). Without prepacking nothing is copied, which is
    # what makes a staged promotion cost about a memcpy.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    own = request.ort_session  # config.pbtxt's onnxruntime parameters
    if "execution_mode" in own:
        parallel = own["execution_mode"] == "1"
        mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
        options.execution_mode = mode
    if "enable_mem_arena" in own:
        options.enable_cpu_mem_arena = own["enable_mem_arena"] == "1"
    if "enable_mem_pattern" in own:
        options.enable_mem_pattern = own["enable_mem_pattern"] == "1"
    if not request.prepack_weights:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.log_severity_level = 3
    return options


def warm_up(session: ort.InferenceSession, weights: dict[str, np.ndarray] | None = None) -> None:
    """Run once on zeros (dynamic dims = 1) so lazy work, and the first touch of the
    mapped weights, happen now rather than in the first client request; `weights`
    are fed as they are (a shared session's, shared_graphs.py)."""
    feeds: dict[str, np.ndarray] = dict(weights or {})
    for arg in session.get_inputs():
        if arg.name in feeds:
            continue
        dtype = _ORT_TO_NUMPY.get(arg.type)
        if dtype is None:
            return
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in (arg.shape or [])]
        feeds[arg.name] = (
            np.full(shape, "", dtype=object) if dtype is object else np.zeros(shape, dtype=dtype)
        )
    try:
        session.run(None, feeds)
    except Exception as exc:  # a model may reject synthetic inputs; that is not fatal
        log.info("warm-up skipped: %s", str(exc)[:200])


def run_samples(
    session: ort.InferenceSession,
    weights: dict[str, np.ndarray] | None,
    request: ipc.LoadModel,
    payload: memoryview,
) -> None:
    """The model's own warm-up samples (config.pbtxt's model_warmup: the load's
    `warmup`, their tensors in its `payload`), each run its number of times, in place
    of `warm_up`'s zeros; a ValueError naming the sample that fails, or that is still
    running after the load's `warmup_s` in all (0: no limit), and so fails the load."""
    limit_s = request.warmup_s
    deadline = time.monotonic() + limit_s if limit_s > 0 else None
    offset = 0
    for name, runs, descs in request.warmup:
        size = sum(desc[3] for desc in descs)
        arrays = framing.unpack_tensors(descs, payload[offset : offset + size])
        offset += size
        feeds = {n: as_text(a) for n, a in arrays.items()}
        feeds = reshaped(feeds, request.reshape_inputs, request.batched)
        feeds.update(weights or {})  # after the sample's, as a request's (WithWeights)
        for _ in range(runs):
            if deadline is not None and time.monotonic() > deadline:
                raise ValueError(f"model_warmup '{name}' did not finish within {limit_s:g} s")
            try:
                session.run(None, feeds)
            except Exception as exc:
                raise ValueError(f"model_warmup '{name}' failed: {exc}") from None


def reshaped(
    arrays: dict[str, np.ndarray], shapes: dict[str, list[int]], batched: bool
) -> dict[str, np.ndarray]:
    """`arrays` with those named in `shapes` reshaped (config.pbtxt's `reshape`: to the
    graph's dims for inputs, to the clients' for outputs), each keeping its batch
    dimension first when `batched`. A view: no copy."""
    if not shapes:
        return arrays
    out = dict(arrays)
    for name, shape in shapes.items():
        array = out.get(name)
        if array is not None:
            out[name] = array.reshape((*array.shape[:1], *shape) if batched else tuple(shape))
    return out


_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": object,
}


def scrub(message: str, model_file: str, staged_dir: str) -> str:
    """ORT errors name the files they read; clients must not see local paths. Keeps
    only what lies below the repository or the staging root: <model>/<version>/..."""
    for path, depth in ((model_file, 3), (staged_dir, 2)):
        root = Path(path)
        for _ in range(depth):
            root = root.parent
        if root != root.parent:  # never strip a bare "/"
            message = message.replace(f"{root}{os.sep}", "").replace(str(root), "<root>")
    return message


def as_text(array: np.ndarray) -> np.ndarray:
    """BYTES arrive as bytes; ONNX Runtime's string tensors take str (bytes would be
    fed as their repr)."""
    if array.dtype != object:
        return array
    out = np.empty(array.size, dtype=object)
    out[:] = [b.decode() for b in array.reshape(-1)]
    return out.reshape(array.shape)
