"""Redis as a fleet runs it: a primary, a replica and three Sentinels, under a control
plane that is being written to. The primary is killed (SIGKILL) mid-traffic and the
Sentinels promote the replica; nothing the control plane acknowledged is lost
(catalog entries, sites, usage minutes, batch jobs: it acknowledges those only once
the replica has them, WAIT), and placement misses at most one round."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import shutil
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
import redis

from edgeplex.agent.catalog import demo
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.services import (
    MASTER,
    TOKEN,
    ControlPlane,
    Mosquitto,
    RedisReplica,
    RedisServer,
    Sentinel,
    Service,
    join_token,
    online_replicas,
    sentinel_url,
    usage_minutes_on,
)
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from edgeplex.control_plane.leader import LeaderLease

AUTH = (("authorization", f"Bearer {TOKEN}"),)
ROUND_S = 3.0  # the control plane's placement interval here


@pytest.fixture
def redis_ha(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisReplica, list[Sentinel]]]:
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    primary = RedisServer(tmp_path / "primary")
    replica = RedisReplica(tmp_path / "replica", primary)
    sentinels = [Sentinel(tmp_path, primary) for _ in range(3)]
    services: list[Service] = [primary, replica, *sentinels]
    try:
        for service in services:
            service.start()
        probe = redis.Redis(port=sentinels[0].port)
        wait_until(
            lambda: probe.sentinel_slaves(MASTER) and probe.sentinel_sentinels(MASTER),
            timeout=30, what="the sentinels to find the replica and each other",
        )  # fmt: skip
        wait_until(lambda: online_replicas(primary.port) == 1, what="the replica in sync")
        yield primary, replica, sentinels
    finally:
        for service in reversed(services):
            service.stop()


class Writer:
    """A client that calls one verb again and again, each call retried until the
    control plane acknowledges it (as a careful client does through a failover):
    what was acknowledged, and how many calls were refused on the way."""

    def __init__(self, name: str, call: Callable[[int], str]) -> None:
        self.name, self.call = name, call
        self.acked: list[str] = []
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self.acked.append(self.call(i))
                i += 1
            except grpc.RpcError as exc:
                assert exc.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ), exc
                self.refused += 1
                time.sleep(0.05)
            time.sleep(0.02)


def test_a_primary_killed_under_load_loses_nothing_acknowledged(
    tmp_path: Path, redis_ha: tuple[RedisServer, RedisReplica, list[Sentinel]]
) -> None:
    primary, replica, sentinels = redis_ha
    mqtt = Mosquitto(tmp_path)
    mqtt.start()
    cp = ControlPlane(
        tmp_path, primary, mqtt.url(), sentinel_url(sentinels),
        EDGEPLEX_CP_PLACEMENT_INTERVAL_S=str(ROUND_S),
    )  # fmt: skip
    artifact = tmp_path / "model.onnx"
    demo.make_mlp(tmp_path / "repo" / "m", width=8, layers=1, in_width=8)
    shutil.copy(next((tmp_path / "repo" / "m").rglob("*.onnx")), artifact)
    cp.start()
    channel = grpc.insecure_channel(cp.address)
    admin = pb_grpc.AdminServiceStub(channel)
    agents = pb_grpc.AgentServiceStub(channel)
    try:
        # As an agent joins: retried while the control plane answers UNAVAILABLE (a write
        # whose replica has not acknowledged it in time, on a busy machine).
        token = wait_until(lambda: join_token(cp, "s0", "r0"), what="a join token")
        site = (("authorization", f"Bearer {token}"),)
        wait_until(
            lambda: agents.Register(
                pb.RegisterRequest(site_id="s0", region="r0", address="127.0.0.1:1"),
                metadata=site, timeout=10,
            ),
            what="s0 registered",
        )  # fmt: skip
        sha = hashlib.sha256(artifact.read_bytes()).hexdigest()

        def add_model(i: int) -> str:
            name = f"m{i}"
            admin.AddModel(pb.CatalogModel(name=name, artifact_uri=artifact.as_uri(), sha256=sha),
                           metadata=AUTH, timeout=10)  # fmt: skip
            return name

        def add_site(i: int) -> str:
            admin.AddSite(pb.AddSiteRequest(site_id=f"x{i}", region="r1"), metadata=AUTH,
                          timeout=10)  # fmt: skip
            return f"x{i}"

        now_minute = int(time.time() // 60)  # recent minutes: old ones are dropped

        def usage(i: int) -> str:
            record = pb.UsageRecord(tenant="acme", model="m0", version="1", requests=i + 1)
            minute = pb.UsageReport(site_id="s0", minute=now_minute + i, interval_s=60,
                                    records=[record])  # fmt: skip
            agents.ReportUsage(minute, metadata=site, timeout=10)
            return f"s0/{now_minute + i}"

        def batch(i: int) -> str:
            job = admin.SubmitBatch(pb.BatchSubmit(model="m0", inputs=['{"inputs": []}']),
                                    metadata=AUTH, timeout=10)  # fmt: skip
            return job.job_id

        add_model(0)
        writers = [Writer(n, f) for n, f in (("models", add_model), ("sites", add_site),
                                             ("usage", usage), ("batch", batch))]  # fmt: skip
        versions: list[tuple[float, int]] = []  # (when, placement version) as seen

        def watch() -> None:
            while not writers[0].stop.is_set():
                try:
                    placed = admin.GetPlacement(pb.PlacementRequest(), metadata=AUTH, timeout=5)
                    if not versions or versions[-1][1] != placed.version:
                        versions.append((time.monotonic(), placed.version))
                except grpc.RpcError:
                    pass
                time.sleep(0.1)

        # A site's report stream, open through the failover: it is not ended (a
        # thousand agents registering again at once), its reports are kept.
        streamed: list[object] = []

        def reports() -> Iterator[pb.LoadReport]:
            while not writers[0].stop.is_set():
                yield pb.LoadReport(site_id="s0", sent_at=time.time())
                time.sleep(0.25)

        def stream() -> None:
            try:
                streamed.append(agents.Report(reports(), metadata=site, timeout=120).reports)
            except grpc.RpcError as exc:
                streamed.append(exc.code())

        watcher, reporter = threading.Thread(target=watch), threading.Thread(target=stream)
        for writer in writers:
            writer.thread.start()
        watcher.start()
        reporter.start()
        time.sleep(2 * ROUND_S)
        killed_at = time.monotonic()
        primary.stop(signal.SIGKILL)
        probe = redis.Redis(port=sentinels[0].port)
        wait_until(
            lambda: probe.sentinel_get_master_addr_by_name(MASTER)[1] == replica.port,
            timeout=30, what="the sentinels to promote the replica",
        )  # fmt: skip
        promoted_s = time.monotonic() - killed_at
        # Its service manager restarts the old primary; the Sentinels make it the new
        # primary's replica. Until it has synced, writes that must survive are refused
        # (no replica has them): the writers retry.
        primary.start()
        # A Sentinel asks a replica for INFO every 10 s and turns a returning primary
        # into a replica once it has reported itself a primary for 8 s: about 20 s
        # alone, and a whole suite's run once took over 30. On a loaded machine the
        # Sentinels may also fail over a second time (the new primary, busy just after
        # its promotion, silent past down-after-milliseconds) and promote the restarted
        # old one back. Nothing acknowledged is lost either way: no write is
        # acknowledged before a replica has it. So the test follows the primary the
        # Sentinels settle on.
        sentinel_probes = [redis.Redis(port=s.port) for s in sentinels]

        def settled() -> int | None:
            ports = {int(p.sentinel_get_master_addr_by_name(MASTER)[1]) for p in sentinel_probes}
            port = ports.pop() if len(ports) == 1 else None
            return port if port is not None and online_replicas(port) == 1 else None

        wait_until(settled, timeout=60, what="one primary the Sentinels agree on, with a replica")
        back = {w.name: len(w.acked) for w in writers}
        time.sleep(2 * ROUND_S)
        for writer in writers:
            writer.stop.set()
            writer.thread.join(30)
        watcher.join(30)
        reporter.join(30)

        assert len(streamed) == 1 and isinstance(streamed[0], int), streamed
        assert streamed[0] > 4 * ROUND_S * 2, streamed  # about four reports a second
        # Everything acknowledged is on the new primary.
        now = wait_until(settled, timeout=30, what="the Sentinels' primary, still settled")
        new = redis.Redis(port=now)
        models = {k.decode() for k in new.hkeys("edgeplex:models")}
        sites = {k.decode() for k in new.hkeys("edgeplex:join_tokens")}
        minutes = usage_minutes_on(now)
        jobs = {k.decode() for k in new.hkeys("edgeplex:batch:jobs")}
        report = {w.name: (len(w.acked), w.refused) for w in writers}
        assert all(len(w.acked) > 20 for w in writers), report
        assert set(writers[0].acked) <= models, report
        assert set(writers[1].acked) <= sites, report
        assert set(writers[2].acked) <= minutes, report
        assert set(writers[3].acked) <= jobs, report
        # Writes went on after the failover, through the same control plane.
        assert all(len(w.acked) > back[w.name] for w in writers), (
            back,
            report,
            new.info("replication"),
            cp.log()[-3000:],
        )
        # Placement: rounds resumed, and the gap around the kill missed at most one
        # round, counted as bench/fleet_scale.py counts it: the rounds that should
        # have ended within the gap, one every ROUND_S (the loop keeps its period),
        # less the one that ended it. A gap of 7.05 s misses one round (seen once,
        # on a loaded machine); two missed would be about 9 s.
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(versions) if b > killed_at]
        assert gaps and versions[-1][0] > killed_at + promoted_s, versions
        missed = max(0, round(max(gaps) / ROUND_S) - 1)
        print(json.dumps({"promoted_s": round(promoted_s, 2), "writes": report,
                          "placement_gap_s": round(max(gaps), 2),
                          "rounds_missed": missed}))  # fmt: skip
        assert missed <= 1, (promoted_s, versions)
    finally:
        channel.close()
        cp.stop()
        mqtt.stop()


async def until(condition: Callable[[], bool]) -> None:
    """Wait (up to 10 s) until `condition` holds, on the event loop."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


@contextlib.asynccontextmanager
async def leading(redis_url: str, lease_s: float) -> AsyncIterator[LeaderLease]:
    """Replica cp-a's leader lease on the Redis at `redis_url`, its loop running,
    once it holds the lease."""
    from edgeplex.control_plane.leader import LeaderLease
    from edgeplex.control_plane.store import Store

    store = Store(redis_url)
    lease = LeaderLease(store.redis, "cp-a", lease_s=lease_s)
    task = asyncio.create_task(lease.run())
    try:
        await until(lambda: lease.is_leader)
        yield lease
    finally:
        task.cancel()
        await store.close()


def test_a_leader_whose_loop_is_saturated_keeps_its_lease(tmp_path: Path) -> None:
    """A control plane's loop busy for seconds on end (a thousand sites' reports and
    a round) ran a renewal on the loop only between its busy stretches, twice a
    renewal: the lease lapsed with the loop running. On its own thread the lease
    holds while the loop runs, busy or not, and the term does not change."""
    from edgeplex.control_plane.leader import LeaderLease
    from edgeplex.control_plane.redis_client import connect

    server = RedisServer(tmp_path)
    server.start()

    async def scenario() -> tuple[list[bool], float, float]:
        lease = LeaderLease(connect(server.url, 1)[0], "cp-a", lease_s=2.0)
        task = asyncio.create_task(lease.run_on_thread())
        try:
            await until(lambda: lease.is_leader)
            since, seen = lease.since, []
            for _ in range(12):  # 0.5 s busy, one turn for the other tasks, again
                time.sleep(0.5)
                seen.append(lease.is_leader)
                await asyncio.sleep(0)
            return seen, since, lease.since
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        seen, since, since_after = asyncio.run(scenario())
        with redis.Redis.from_url(server.url) as client:
            assert client.get("edgeplex:leader") is None  # released as it stopped
    finally:
        server.stop()
    assert all(seen), seen
    assert since_after == since


def test_a_leader_paused_past_its_lease_does_not_lead_when_it_runs_again(
    tmp_path: Path,
) -> None:
    """A replica whose loop stood still longer than its lease (SIGSTOP, a paused VM,
    a blocking call) no longer leads the moment it runs again, before it has heard
    from Redis: another replica may have taken the lease meanwhile. Taking the lease
    again, it counts its hearing of the sites from then (`hearing_since`)."""
    server = RedisServer(tmp_path)
    server.start()

    async def scenario() -> tuple[bool, float, float]:
        async with leading(server.url, lease_s=1.0) as lease:
            heard = lease.hearing_since
            time.sleep(1.2)  # the loop stands still past the lease
            leads_on_waking = lease.is_leader  # nothing else has run yet
            await until(lambda: lease.is_leader)  # nobody else wanted it: taken again
            return leads_on_waking, heard, lease.hearing_since

    try:
        leads_on_waking, heard, heard_again = asyncio.run(scenario())
    finally:
        server.stop()
    assert not leads_on_waking
    assert heard_again >= heard + 1.2


def test_a_leader_back_within_a_lease_after_a_blip_resumes_its_term(
    tmp_path: Path,
) -> None:
    """Redis gone for a moment (a failover, a restart): the leader steps down at once,
    and when it holds the lease again within a lease period it resumes the same term
    (`since` unchanged: the planner need not wait out the fleet's reports again).
    Away longer than a lease, when another replica could have led, it starts a new
    one."""
    server = RedisServer(tmp_path)
    server.start()

    async def scenario() -> tuple[float, float, float]:
        async with leading(server.url, lease_s=3.0) as lease:
            began = lease.since
            server.stop()
            await until(lambda: not lease.is_leader)
            server.start()  # the key comes back from its append-only file
            await until(lambda: lease.is_leader)
            resumed = lease.since
            server.stop()
            await until(lambda: not lease.is_leader)
            await asyncio.sleep(3.5)  # the lease lapses: another replica may have led
            server.start()
            await until(lambda: lease.is_leader)
            return began, resumed, lease.since

    try:
        began, resumed, renewed = asyncio.run(scenario())
    finally:
        server.stop()
    assert resumed == began
    assert renewed > began
