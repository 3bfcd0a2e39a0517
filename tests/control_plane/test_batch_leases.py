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
from tests.support.fake_site import fake_infer_site

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


def test_a_deposed_leader_stops_its_runs_and_the_new_leader_finishes_them(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica a is running a shard whose site hangs when it loses the leader lease:
    it drops the request at once, and replica b runs the shard after the lease
    lapses, recording its outputs once."""
    from aiohttp import web

    from edgeplex.control_plane import batch

    monkeypatch.setattr(batch, "SHARD_LEASE_S", 3.0)
    calls: list[float] = []
    dropped: list[float] = []

    async def infer(request: web.Request) -> web.Response:
        calls.append(time.monotonic())
        if len(calls) == 1:  # the first run hangs until its client goes away
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)
            dropped.append(time.monotonic())
            return web.Response(status=503)
        return web.json_response({"outputs": [{"name": "y", "data": [len(calls)]}]})

    async def scenario() -> list[str]:
        async with fake_infer_site(infer) as port:
            return await run(port)

    async def run(port: int) -> list[str]:
        store = Store(redis_url)
        await store.redis.flushdb()  # no sites or jobs from the tests before
        replicas = []
        for name in ("cp-a", "cp-b"):
            lease = LeaderLease(store.redis, name, 1.5)
            replicas.append((lease, BatchRunner(store, lease, {})))
        a_lease, a_runner = replicas[0]
        tasks = [asyncio.create_task(a_lease.run()), asyncio.create_task(a_runner.run())]
        try:
            await store.put_site(
                pb.Site(site_id="slow", region="a", address="127.0.0.1:1",
                        http_address=f"127.0.0.1:{port}", up=True)
            )  # fmt: skip
            job, shards = make_job("m", [json.dumps({"inputs": []})], 5)
            await store.put_batch(job, shards)
            await until(lambda: bool(calls), "replica a's run reaches the site")
            # Replica b takes the leader key (a's next renewal fails): a is deposed.
            b_lease, b_runner = replicas[1]
            await store.redis.set("edgeplex:leader", "cp-b", px=1500)
            tasks += [asyncio.create_task(b_lease.run()), asyncio.create_task(b_runner.run())]
            await until(lambda: bool(dropped), "replica a drops its run")
            assert dropped[0] - calls[0] < 8.0
            outputs: dict = {}

            async def finished() -> bool:
                outputs.update(await store.batch_outputs(job.job_id))
                return bool(outputs)

            await until(finished, "replica b finishes the shard")
            assert len(calls) == 2 and calls[1] > dropped[0]
            leases = await store.batch_leases(job.job_id)
            assert leases[0].holder == "cp-b" and leases[0].attempt == 2
            return json.loads(outputs[0])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await store.close()

    outputs = asyncio.run(scenario())
    assert [json.loads(o)["outputs"][0]["data"] for o in outputs] == [[2]]


async def until(check, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out: {what}")
