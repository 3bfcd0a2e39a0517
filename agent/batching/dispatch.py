"""How a model's batches reach its runner: the batcher's `execute` over IPC.

Made by the queues (queues.py) when a model first serves; the batcher then lives
as long as the model is loaded (across runner restarts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Protocol

import numpy as np

from edgeplex.agent.batching.batcher import Batcher, BatchResult
from edgeplex.agent.batching.rate_limiter import RateLimiter
from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.observability.stats import ModelStats
from edgeplex.agent.observability.usage import BatchUsage, Journal, Model
from edgeplex.agent.oip.errors import InferenceFailed, InvalidInput, RunnerLost
from edgeplex.agent.runners import framing, ipc
from edgeplex.agent.runners.supervisor import RunnerPool

log = logging.getLogger("edgeplex.agent.batching")


class Served(Model, Protocol):
    """What the batcher needs to know of a model (a residency record is one): what
    its usage is counted under (Model), and how its batches reach its runner."""

    @property
    def key(self) -> Hashable: ...
    @property
    def runner_id(self) -> str: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def max_batch_size(self) -> int: ...


def make_batcher(
    entry: Served,
    pool: RunnerPool,
    ready: asyncio.Event,
    stats: ModelStats,
    usage: Journal | None = None,
    limiter: RateLimiter | None = None,
) -> Batcher:
    """The model's queue and batcher, executing each batch on the model's runner and
    counting the requests it answers into the usage journal (when one is kept); with
    a rate `limiter`, a model that names resources runs a batch only while it holds
    them."""
    config = entry.config
    model_id = str(entry.key)
    timeout_s = config.execution_timeout_ms / 1000

    def execute(
        inputs: dict[str, np.ndarray], outputs: list[str] | None
    ) -> asyncio.Future[tuple[ipc.Message, memoryview]]:
        """Write the batch to the runner now; the future is the runner's reply, which
        the batcher reads with `read` (in the callback that answers the batch: no
        task and no second future per batch)."""
        descs, buffers = framing.pack_tensors(inputs)
        return pool.run_batch(entry.runner_id, model_id, outputs, descs, buffers, timeout_s)

    def read(reply: asyncio.Future[tuple[ipc.Message, memoryview]]) -> BatchResult:
        """The batch's outputs from the runner's reply, or the error it stands for."""
        try:
            message, payload = reply.result()
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
            pool.get(entry.runner_id).abandon(f"a batch of {entry.name} hung")
            raise RunnerLost(entry.runner_id) from None
        if isinstance(message, ipc.InferResult):
            outputs = framing.unpack_tensors(message.tensors, payload)
            return outputs, message.compute_ns, message.form
        assert isinstance(message, ipc.Failure)
        if message.kind == "invalid":
            raise InvalidInput(f"model '{entry.name}': {message.message}")
        if message.kind == "not_loaded":
            raise RunnerLost(entry.runner_id)
        raise InferenceFailed(f"model '{entry.name}': {message.message}")

    return Batcher(
        entry.name,
        max_batch_size=entry.max_batch_size,
        max_queue_delay_us=config.max_queue_delay_us,
        max_queue_size=config.max_queue_size,
        level_caps={
            level: policy.max_queue_size
            for level, policy in config.priority_queue_policy.items()
            if policy.max_queue_size is not None
        },
        preferred_batch_sizes=tuple(config.preferred_batch_sizes),
        instance_count=config.instance_count,
        execute=execute,
        read=read,
        ready=ready,
        stats=stats,
        count=BatchUsage(usage, entry) if usage is not None else None,
        gate=(
            limiter.gate(config.rate_limit_resources, config.rate_limit_priority)
            if limiter is not None and config.rate_limit_resources
            else None
        ),
    )
