"""How a model's batches reach its runner: the batcher's `execute` over IPC.

Called by the model table when a model first becomes READY; the batcher then
lives as long as the model is loaded (across runner restarts).
"""

from __future__ import annotations

import numpy as np

from edgeplex.agent import ipc
from edgeplex.agent.batcher import Batcher
from edgeplex.agent.entry import ModelEntry
from edgeplex.agent.errors import InferenceFailed, InvalidInput, RunnerLost
from edgeplex.agent.runners import RunnerPool


def make_batcher(entry: ModelEntry, pool: RunnerPool) -> Batcher:
    """The model's queue and batcher, executing each batch on the model's runner."""
    config = entry.config

    async def execute(
        inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> tuple[dict[str, np.ndarray], int]:
        descs, buffers = ipc.pack_tensors(inputs)
        runner = pool.get(entry.runner_id)
        reply, payload = await runner.call(
            ipc.Infer(pool.next_req_id(), entry.name, outputs, descs), buffers
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
        ready=entry.ready,
        stats=entry.stats,
    )
