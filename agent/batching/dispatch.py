"""How a model's batches reach its runner: the batcher's `execute` over IPC.

Called by the residency effects when a model first becomes READY; the batcher
then lives as long as the model is loaded (across runner restarts).
"""

from __future__ import annotations

import asyncio

import numpy as np

from edgeplex.agent.batching.batcher import Batcher
from edgeplex.agent.errors import InferenceFailed, InvalidInput, RunnerLost
from edgeplex.agent.residency.state import ModelRecord
from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.supervisor import RunnerPool
from edgeplex.agent.stats import ModelStats


def make_batcher(
    entry: ModelRecord, pool: RunnerPool, ready: asyncio.Event, stats: ModelStats
) -> Batcher:
    """The model's queue and batcher, executing each batch on the model's runner."""
    config = entry.config
    model_id = str(entry.key)

    async def execute(
        inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> tuple[dict[str, np.ndarray], int]:
        descs, buffers = ipc.pack_tensors(inputs)
        runner = pool.get(entry.runner_id)
        reply, payload = await runner.call(
            ipc.Infer(pool.next_req_id(), model_id, outputs, descs), buffers
        )
        if isinstance(reply, ipc.InferResult):
            return ipc.unpack_tensors(reply.tensors, payload), reply.compute_ns
        assert isinstance(reply, ipc.Failure)
        if reply.kind == "invalid":
            raise InvalidInput(f"model '{entry.name}': {reply.message}")
        if reply.kind == "not_loaded":
            raise RunnerLost(entry.runner_id)
        raise InferenceFailed(f"model '{entry.name}': {reply.message}")

    return Batcher(
        entry.name,
        max_batch_size=entry.max_batch_size,
        max_queue_delay_us=config.max_queue_delay_us,
        max_queue_size=config.max_queue_size,
        instance_count=config.instance_count,
        execute=execute,
        ready=ready,
        stats=stats,
    )
