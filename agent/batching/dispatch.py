"""How a model's batches reach its runner: the batcher's `execute` over IPC.

Called by the residency effects when a model first becomes READY; the batcher
then lives as long as the model is loaded (across runner restarts).
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from edgeplex.agent.batching.batcher import Batcher
from edgeplex.agent.errors import InferenceFailed, InvalidInput, RunnerLost
from edgeplex.agent.metrics import METRICS
from edgeplex.agent.residency.state import ModelRecord
from edgeplex.agent.runners import framing, ipc
from edgeplex.agent.runners.supervisor import RunnerPool
from edgeplex.agent.stats import ModelStats

log = logging.getLogger("edgeplex.agent.batching")


def make_batcher(
    entry: ModelRecord, pool: RunnerPool, ready: asyncio.Event, stats: ModelStats
) -> Batcher:
    """The model's queue and batcher, executing each batch on the model's runner."""
    config = entry.config
    model_id = str(entry.key)
    timeout_s = config.execution_timeout_ms / 1000

    async def execute(
        inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> tuple[dict[str, np.ndarray], int, str]:
        descs, buffers = framing.pack_tensors(inputs)
        runner = pool.get(entry.runner_id)
        try:
            reply, payload = await asyncio.wait_for(
                runner.call(ipc.Infer(pool.next_req_id(), model_id, outputs, descs), buffers),
                timeout_s,
            )
        except TimeoutError:
            # Hung: a stuck kernel or a poison input. Killing the runner is the only
            # way to get the worker back; the batcher runs the batch again.
            log.error(
                "model %s: a batch ran past the %.1f s execution timeout; killing runner %s",
                entry.key,
                timeout_s,
                entry.runner_id,
            )
            METRICS.hung_batches.labels(model=entry.name).inc()
            runner.abandon(f"a batch of {entry.name} hung")
            raise RunnerLost(entry.runner_id) from None
        if isinstance(reply, ipc.InferResult):
            return framing.unpack_tensors(reply.tensors, payload), reply.compute_ns, reply.form
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
