"""Cumulative statistics of each model version, in the shape of OIP ModelStatistics.

Updated by the batcher on the event loop; read by the front doors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeplex.agent.batching.policy import Request


FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")  # as Triton lists them


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)  # the lookups that found an answer
    cache_miss: Duration = field(default_factory=Duration)  # the lookups and insertions
    batches: dict[int, BatchStats] = field(default_factory=dict)
    # Failures by the reason Triton labels them with (errors.py's failure_reason).
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))

    def record_batch(
        self,
        batch: list[Request],
        started: float,
        assembled: float,
        compute_ns: int,
        done: float,
        returned: float,
    ) -> None:
        """A batch that succeeded: `started` when it left the queue, `assembled` when
        its inputs were concatenated, `returned` when the runner answered, `done`
        when every member had its result (monotonic seconds). As Triton's, the batch
        statistics are kept by the batch's size in rows (its requests' batch sizes
        summed; 1 a request for a model that does not batch), not by request count."""
        n = len(batch)
        rows = sum(request.batch_size for request in batch)
        compute = compute_ns / 1e9
        ipc_overhead = max(0.0, (returned - assembled) - compute)
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        per_batch = self.batches.setdefault(rows, BatchStats())
        per_batch.compute_input.add(assembled - started)
        per_batch.compute_infer.add(compute)
        per_batch.compute_output.add(done - returned + ipc_overhead)
        # Sums over the batch, not an update per request: the batcher's hot path.
        enqueued = sum(request.enqueued for request in batch)
        self.inference_count += rows
        self.success.add(n * done - enqueued, n)
        self.queue.add(n * started - enqueued, n)
        self.compute_input.add(n * (assembled - started), n)
        self.compute_infer.add(n * compute, n)
        self.compute_output.add(n * (done - returned + ipc_overhead), n)

    def record_cache_hit(self, seconds: float, lookup_s: float) -> None:
        """A request answered from the response cache: a success, but, as Triton counts
        it, neither an inference nor an execution."""
        self.last_inference_ms = int(time.time() * 1000)
        self.success.add(seconds)
        self.cache_hit.add(lookup_s)

    def record_request(self, seconds: float, count: int = 1) -> None:
        """A request that succeeded, counted whole (an ensemble's: its steps' models
        count their queue and compute times)."""
        self.execution_count += 1
        self.inference_count += count
        self.last_inference_ms = int(time.time() * 1000)
        self.success.add(seconds)

    def record_failure(self, seconds: float, reason: str = "OTHER") -> None:
        self.fail.add(seconds)
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def to_json(self, name: str, version: str) -> dict[str, object]:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(),
                "fail": self.fail.to_json(),
                "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(),
                "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                "cache_hit": self.cache_hit.to_json(),
                "cache_miss": self.cache_miss.to_json(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.to_json(),
                    "compute_infer": b.compute_infer.to_json(),
                    "compute_output": b.compute_output.to_json(),
                }
                for size, b in sorted(self.batches.items())
            ],
        }
