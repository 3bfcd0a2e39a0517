"""The batch verbs of AdminService: submit, status, results, list, cancel (batch.py
runs them)."""

from __future__ import annotations

import json
import logging
import time

import grpc
from redis.exceptions import RedisError

from edgeplex.control_plane.batch import make_job
from edgeplex.control_plane.store import ShardLease, Store
from edgeplex.names import valid_name
from edgeplex.proto import edgeplex_control_pb2 as pb

log = logging.getLogger("edgeplex.control_plane.admin")


def redis_down(context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
    """Abort the call: Redis is unreachable (the caller may retry)."""
    return context.abort(grpc.StatusCode.UNAVAILABLE, "control-plane state (Redis) is unavailable")


class BatchAdmin:
    """The batch verbs of AdminService (mixed into AdminServicer)."""

    _store: Store

    async def SubmitBatch(
        self, request: pb.BatchSubmit, context: grpc.aio.ServicerContext
    ) -> pb.BatchJob:
        if not valid_name(request.model):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model: not a valid model name")
        try:
            job, shards = make_job(request.model, list(request.inputs), request.shard_size)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        try:
            if await self._store.get_model(request.model) is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not in the catalog"
                )
            await self._store.put_batch(job, shards)
        except RedisError:
            await redis_down(context)
        log.info("batch %s: %d items of %s in %d shards", job.job_id, job.items, job.model,
                 job.shards)  # fmt: skip
        return job

    async def GetBatch(
        self, request: pb.BatchRef, context: grpc.aio.ServicerContext
    ) -> pb.BatchJob:
        try:
            job = await self._store.get_batch(request.job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no batch job '{request.job_id}'")
            assert job is not None
            done = await self._store.batch_done_shards(job.job_id)
            leases = await self._store.batch_leases(job.job_id)
        except RedisError:
            await redis_down(context)
            raise
        job.shards_done = len(done)
        for index in range(job.shards):
            lease = leases.get(index, ShardLease("", 0.0, 0))
            running = lease.expiry > time.time()
            state = "DONE" if index in done else ("RUNNING" if running else "PENDING")
            job.shard_states.append(
                pb.BatchShard(index=index, state=state, site_id=lease.site, attempts=lease.attempt)
            )
        return job

    async def GetBatchResults(
        self, request: pb.BatchRef, context: grpc.aio.ServicerContext
    ) -> pb.BatchResults:
        try:
            job = await self._store.get_batch(request.job_id)
            if job is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no batch job '{request.job_id}'")
            assert job is not None
            outputs = await self._store.batch_outputs(job.job_id)
        except RedisError:
            await redis_down(context)
            raise
        if job.state == "CANCELLED":
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"batch '{job.job_id}' was cancelled"
            )
        if len(outputs) < job.shards:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"batch '{job.job_id}' is not done: {len(outputs)} of {job.shards} shards",
            )
        results = pb.BatchResults(job_id=job.job_id)
        for index in range(job.shards):
            results.outputs.extend(json.loads(outputs[index]))
        return results

    async def ListBatches(
        self, request: pb.ListBatchesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListBatchesResponse:
        try:
            jobs = sorted(await self._store.batch_jobs(), key=lambda j: j.created_at)
            for job in jobs:
                if job.state == "RUNNING":
                    job.shards_done = len(await self._store.batch_done_shards(job.job_id))
        except RedisError:
            await redis_down(context)
            raise
        return pb.ListBatchesResponse(jobs=jobs)

    async def CancelBatch(
        self, request: pb.BatchRef, context: grpc.aio.ServicerContext
    ) -> pb.BatchJob:
        try:
            job = await cancel_batch(self._store, request.job_id)
        except RedisError:
            await redis_down(context)
            raise
        except LookupError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        return job


async def cancel_batch(store: Store, job_id: str) -> pb.BatchJob:
    """Cancel a running job (a cancelled one stays so). Raises LookupError for an
    unknown job, ValueError for one that is done."""
    job = await store.get_batch(job_id)
    if job is None:
        raise LookupError(f"no batch job '{job_id}'")
    if job.state == "DONE":
        raise ValueError(f"batch '{job_id}' is already done")
    if job.state == "RUNNING":
        job.state = "CANCELLED"
        job.finished_at = time.time()
        await store.update_batch(job)
        log.info("batch %s cancelled", job_id)
    return job
