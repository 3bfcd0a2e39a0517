"""Batch shard leases against a real Redis: taken with compare-and-set, and a
shard whose runs keep failing fails its items with
the reason after MAX_ATTEMPTS runs instead of being retried forever."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from edgeplex.control_plane.batch import MAX_ATTEMPTS, BatchRunner, make_job
from edgeplex.control_plane.leader import LeaderLease
from edgeplex.control_plane.store import ShardLease, Store
from edgeplex.proto import edgeplex_control_pb2 as pb
from tests.services import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def test_only_one_replica_wins_a_lease(redis_url: str) -> None:
    async def scenario() -> list[bool]:
        store = Store(redis_url)
        try:
            await store.redis.delete("edgeplex:batch:j1:lease")
            bids = [ShardLease("s1", time.time() + 15, 1, f"replica{i}") for i in range(5)]
            won = await asyncio.gather(*(store.lease_batch_shard("j1", 0, "", b) for b in bids))
            current = (await store.batch_leases("j1"))[0]
            assert current.holder == f"replica{won.index(True)}"
            # a stale compare (someone renewed meanwhile) loses too
            stale = ShardLease("s1", 1.0, 1, "nobody").format()
            assert not await store.lease_batch_shard("j1", 0, stale, bids[1])
            return won
        finally:
            await store.close()

    assert sum(asyncio.run(scenario())) == 1


def test_a_shard_that_keeps_failing_fails_its_items_with_the_reason(redis_url: str) -> None:
    port = closed_port()

    async def scenario() -> list[str]:
        store = Store(redis_url)
        lease = LeaderLease(store.redis, "cp-test", 2.0)
        runner = BatchRunner(store, lease, {})
        tasks = [asyncio.create_task(lease.run()), asyncio.create_task(runner.run())]
        try:
            await store.put_site(
                pb.Site(site_id="dead", region="a", address="127.0.0.1:1",
                        http_address=f"127.0.0.1:{port}", up=True)
            )  # fmt: skip
            body = json.dumps({"inputs": []})
            job, shards = make_job("m", [body, body], 5)
            await store.put_batch(job, shards)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                outputs = await store.batch_outputs(job.job_id)
                if outputs:
                    leases = await store.batch_leases(job.job_id)
                    assert leases[0].attempt == MAX_ATTEMPTS
                    return [json.loads(doc)["error"] for doc in json.loads(outputs[0])]
                await asyncio.sleep(0.2)
            raise AssertionError("the shard never failed")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await store.close()

    errors = asyncio.run(scenario())
    assert len(errors) == 2
    assert all(f"failed {MAX_ATTEMPTS} times" in e and "dead" in e for e in errors)
