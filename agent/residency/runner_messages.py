"""What the residency effects ask a runner for a model: where its staged copy lies
and the messages that load or stage one of its forms, with the settings of the
provider that will run it. Pure functions of a record and the settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeplex.agent.catalog import ort_parameters
from edgeplex.agent.residency.state import ModelRecord
from edgeplex.agent.runners import framing, ipc
from edgeplex.agent.runners.settings import RunnerSettings

ARENAS = {"same_as_requested": "kSameAsRequested", "next_power_of_two": "kNextPowerOfTwo"}


def staged_dir(root: Path, record: ModelRecord, form: str, provider: str) -> Path:
    """A form's staged copy, optimized for the provider that runs it at the model's
    level: each provider and level has its own, and a replaced artifact (a new
    digest) a new one."""
    name = record.source.digest[:16] or "0"
    if form:
        name += f"-{form}"
    if provider != "cpu":
        name += f"-{provider}"
    level = graph_level(record)
    if level != ort_parameters.DEFAULT_GRAPH_LEVEL:
        name += f"-{level}"
    return root / record.name / record.version / name


def graph_level(record: ModelRecord) -> str:
    return ort_parameters.graph_level(dict(record.source.ort_parameters))


def device(record: ModelRecord, settings: RunnerSettings) -> int:
    """The CUDA device of a model's sessions: its own, else the runners'."""
    own = record.config.device_id if record.source.config else None
    return settings.device_id if own is None else own


def load_message(
    req_id: int, record: ModelRecord, form: str, fast: bool, staged: Path, settings: RunnerSettings
) -> tuple[ipc.LoadModel, list[memoryview]]:
    """The load of one of a model's forms, and the bytes of its warm-up samples (none
    for a `fast` load, a promotion that requests wait for: it does not warm up)."""
    config, source = record.config, record.source
    samples, buffers = ([], []) if fast else warmup_tensors(record)
    # config.pbtxt's reshape: what the graph takes, and what clients get back.
    graph_dims = {t.name: list(t.reshape) for t in source.declared_inputs if t.reshape is not None}
    client_dims = {t.name: list(t.dims) for t in source.declared_outputs if t.reshape is not None}
    parameters = dict(source.ort_parameters)  # config.pbtxt's onnxruntime parameters
    ort_session, cuda_options = ort_parameters.for_runner(parameters)
    inter_op = int(parameters.get("inter_op_thread_count", settings.inter_op_threads))
    message = ipc.LoadModel(
        req_id=req_id,
        model=str(record.key),
        path=str(record.form_path(form)),
        staged_dir=str(staged),
        intra_op_threads=config.intra_op_threads or settings.intra_op_threads,
        inter_op_threads=inter_op,
        allow_spinning=settings.allow_spinning,
        prepack_weights=settings.prepack_weights and not fast,
        provider=settings.execution_provider,
        device_id=device(record, settings),
        memory_limit=config.memory_limit or 0,
        instances=config.instance_count,
        warm_up=not fast,
        warmup=samples,
        warmup_s=settings.load_timeout_s,
        reshape_inputs=graph_dims,
        reshape_outputs=client_dims,
        batched=record.max_batch_size > 0,
        ort_session=ort_session,
        cuda_options=cuda_options,
        form=form,
        cpu_fallback=settings.cpu_fallback,
        arena=ARENAS[config.gpu_arena],
        mapped_weights=settings.keep_staged_mapped,
        share_graphs=settings.share_graphs,
        graph_level=graph_level(record),
    )
    return message, buffers


def warmup_tensors(record: ModelRecord) -> tuple[list[list[Any]], list[memoryview]]:
    """A model's warm-up samples as a load carries them: each [name, runs, tensor
    descriptors], and all their tensors' bytes, sample after sample."""
    samples: list[list[Any]] = []
    buffers: list[memoryview] = []
    for sample in record.source.warmup:
        descs, views = framing.pack_tensors(sample.arrays())
        samples.append([sample.name, sample.runs, descs])
        buffers += views
    return samples, buffers


def stage_message(
    req_id: int, record: ModelRecord, form: str, staged: Path, settings: RunnerSettings
) -> ipc.StageModel:
    return ipc.StageModel(
        req_id,
        str(record.key),
        str(record.form_path(form)),
        str(staged),
        settings.execution_provider,
        device(record, settings),
        graph_level(record),
    )
