"""How the agent runs and supervises its runner processes (`runner.*` settings;
part of AgentSettings in config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgeplex.sizes import parse_size


class RunnerSettings(BaseModel):
    """How the agent runs and supervises its runner processes."""

    model_config = ConfigDict(extra="forbid")

    @field_validator(
        "shared_memory_bytes",
        "shared_memory_threshold_bytes",
        "memory_limit",
        "memory_headroom",
        mode="before",
    )
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)

    sandbox: Literal["off", "best_effort", "required"] = Field(
        default="best_effort",
        description="How runners are confined (docs/security.md, The runner sandbox): their "
        "own user, mount, PID, IPC and network namespaces with a mount view of only the "
        "model paths, capabilities dropped, no_new_privs, Landlock, a seccomp allow-list, "
        "rlimits and a memory cgroup. best_effort: each layer this host cannot provide is "
        "left out, logged and reported (GET /edgeplex/v1/memory, "
        "`edgeplex_runner_sandbox_layer`). required: the agent refuses to start unless "
        "every layer works. off: runners run as plain children of the zygote.",
    )
    sandbox_paths: list[Path] = Field(
        default=[],
        description="More paths a sandboxed runner may read (besides the model repository, "
        "the artifact cache and where the repository's symbolic links lead at its start): "
        "model files that a link made later points into, for instance.",
    )
    memory_limit: int | None = Field(
        default=None,
        description="Host memory the shared runner may use before the kernel kills it (it "
        "alone: the agent restarts it and reloads its models). Unset: the loaded and "
        "staged budgets (device_memory_budget on the CPU, host_memory_budget) plus "
        "memory_headroom, or no limit when neither budget is set. A dedicated runner's "
        "limit is its model's `memory_limit`.",
    )
    memory_headroom: int = Field(
        default=1024 * 1024 * 1024,
        ge=0,
        description="What the shared runner may use beyond its models' budgets (Python, "
        "ONNX Runtime's arenas, the shared rings) before its memory limit binds.",
    )
    max_open_files: int = Field(
        default=4096,
        ge=64,
        description="RLIMIT_NOFILE of a sandboxed runner.",
    )

    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="ONNX Runtime intra-op threads per session; 0 = ONNX Runtime's default "
        "(one per physical core).",
    )
    inter_op_threads: int = Field(default=1, ge=1, description="ONNX Runtime inter-op threads.")
    allow_spinning: bool = Field(
        default=False,
        description="Let ORT's worker threads spin while idle. Faster on an idle box, but "
        "several spinning runners starve each other and the agent.",
    )
    execution_provider: Literal["cpu", "cuda"] = Field(
        default="cpu",
        description="Where sessions run. `cuda` needs onnxruntime-gpu (docs/architecture.md, "
        "GPU builds); device memory is then measured with NVML when nvidia-ml-py is "
        "installed, else from the ORT arena's growth as seen by the process.",
    )
    device_id: int = Field(default=0, ge=0, description="CUDA device of this agent's runners.")
    cpu_fallback: bool = Field(
        default=False,
        description="With `execution_provider: cuda`, serve a model on the CPU when CUDA "
        "cannot run its session (no onnxruntime-gpu, no usable device). Off: such a model "
        "fails with the reason. On: its status (`last_promotion.provider`) and the metric "
        "`edgeplex_model_cpu_fallback` show it.",
    )
    prepack_weights: bool = Field(
        default=True,
        description="Let ORT repack weights for its GEMM kernels when a session is created: "
        "results identical to a default ORT session and up to ~2x faster batched GEMM, but "
        "a promotion then copies every weight. false: sessions map the staged weights "
        "directly, so a staged -> loaded promotion costs about a memcpy (docs/benchmarks.md); "
        "results differ from default ORT in the last bits.",
    )
    keep_staged_mapped: bool = Field(
        default=True,
        description="A runner keeps each staged weights file it has loaded from mapped, and "
        "creates a CPU session without prepacking over that mapping (the weights handed in "
        "as initializers) instead of letting ORT map and fault the file in again: a "
        "promotion of a 13 MB model costs about 0.4 ms instead of 1.4 ms, and a release "
        "nothing. The mapping holds no memory of its own (the pages are the staged copy's) "
        "and is dropped within a second of the staged copy being deleted. false: ORT maps "
        "the staged file for each session.",
    )
    share_graphs: bool = Field(
        default=True,
        description="With keep_staged_mapped, models whose staged graphs are the same but "
        "for their weights (fine-tunes of one base, one architecture trained per site) run "
        "on one shared CPU session of the graph without its weights, each run fed its "
        "model's weights from the kept mapping: a promotion then creates no session once "
        "its graph has one. Outputs are bit for bit those of a session of its own. false: "
        "every promotion creates its own session.",
    )
    prepack_after_s: float = Field(
        default=10.0,
        ge=0,
        description="With prepack_weights, a model promoted on demand first serves from a "
        "session over the mapped staged weights (fast), and is rebuilt prepacked in the "
        "background once it has stayed loaded this long, if the device budget has room "
        "for the transient second copy. Loads at start and explicit loads prepack at once.",
    )
    shared_memory_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        description="Size of each of a runner's two shared tensor rings (requests, results), "
        "allocated in /dev/shm when the runner starts. A batch whose tensors reach "
        "`shared_memory_threshold_bytes` travels through them instead of the runner's "
        "socket; 0 sends every tensor over the socket.",
    )
    shared_memory_threshold_bytes: int = Field(
        default=32 * 1024,
        ge=0,
        description="Smallest batch payload that goes through the shared rings; smaller "
        "ones are as cheap inline in the socket frame.",
    )
    reply_spin_us: int = Field(
        default=300,
        ge=0,
        description="While the only batch in flight belongs to a model whose last round trip "
        "to its runner took less than this, the agent's event loop polls for the reply "
        "instead of sleeping, for at most this long: saves a wake-up per request when "
        "few requests arrive. 0 never polls.",
    )
    idle_spin_us: int = Field(
        default=300,
        ge=0,
        description="After a batch that the agent sent with no other batch in flight, a "
        "runner with nothing else to do polls its socket for the next batch for at most "
        "this long before it sleeps: saves the runner's wake-up per request when few "
        "requests arrive. Polls that keep finding nothing make the next waits sleep at "
        "once (backing off up to 256 waits). 0 never polls.",
    )
    restart_backoff_initial_s: float = Field(
        default=0.1, gt=0, description="Delay before the first restart of a dead runner."
    )
    restart_backoff_max_s: float = Field(
        default=10.0, gt=0, description="Cap of the exponential restart backoff."
    )
    restart_backoff_reset_s: float = Field(
        default=30.0,
        gt=0,
        description="A runner that stays up this long resets its backoff to the initial delay.",
    )
    start_timeout_s: float = Field(
        default=20.0, gt=0, description="Time a new runner has to connect back to the agent."
    )
    load_timeout_s: float = Field(
        default=300.0, gt=0, description="Time one model load may take before it is FAILED."
    )
