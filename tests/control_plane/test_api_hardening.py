"""The control plane's API under misuse: roles, site addresses it could be sent to,
reports that are not reports, streams that outlive their credential, binds
beyond loopback without TLS, and usage ranges the kept usage cannot answer."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from edgeplex.agent.catalog import demo
from edgeplex.artifacts import sha256_of
from edgeplex.control_plane.site_identity import Refused, check_address
from edgeplex.control_plane.store import Store
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.services import TOKEN, ControlPlane, Mosquitto, RedisServer, join_token
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

BATCH, READ = "test-batch-token", "test-read-token"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("api")
    r, m = RedisServer(workdir), Mosquitto(workdir)
    r.start()
    m.start()
    plane = ControlPlane(
        workdir, r, m.url(), EDGEPLEX_CP_BATCH_TOKEN=BATCH, EDGEPLEX_CP_READ_TOKEN=READ
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
        m.stop()
        r.stop()


def code(call, request, token: str) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    try:
        call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_models_added_together_naming_one_artifact_have_it_checked_once(
    cp: ControlPlane,
) -> None:
    """A catalog filled in bulk (thousands of models, a few hundred artifacts) fetches
    and opens each artifact once: the models added while its check runs wait for it.
    Before, each of them started a check of its own, and 10,000 models took ONNX
    Runtime probes one a model, at six at a time."""
    demo.make_mlp(cp.workdir / "bulk", width=8, layers=1, in_width=8, seed=11)
    artifact = cp.workdir / "bulk" / "1" / "model.onnx"
    sha = sha256_of(artifact)
    names = [f"bulk-{i}" for i in range(24)]
    with cp.channel() as channel:
        admin = pb_grpc.AdminServiceStub(channel)
        for name in names:
            model = pb.CatalogModel(name=name, artifact_uri=artifact.as_uri(), sha256=sha)
            admin.AddModel(model, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)

        def ready() -> bool:
            listed = admin.ListModels(
                pb.ListModelsRequest(), metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
            return {m.name for m in listed.models if m.state == "READY"} >= set(names)

        wait_until(ready, timeout=60, what="every bulk model READY")
        # Once checked, an artifact makes a model added later READY at once: placement
        # need not wait a round for a check it has made.
        later = pb.CatalogModel(name="bulk-later", artifact_uri=artifact.as_uri(), sha256=sha)
        added = admin.AddModel(later, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
        assert (added.state, added.size_bytes) == ("READY", artifact.stat().st_size)
    assert cp.log().count(f"artifact {sha[:12]} fetched and opened") == 1


def test_each_role_may_make_its_calls_only(cp: ControlPlane) -> None:
    with grpc.insecure_channel(cp.address) as channel:
        admin = pb_grpc.AdminServiceStub(channel)
        model = pb.CatalogModel(name="m", artifact_uri="https://x/m.onnx", sha256="0" * 64)
        site = pb.AddSiteRequest(site_id="s9", region="a")
        assert code(admin.ListModels, pb.ListModelsRequest(), READ) == grpc.StatusCode.OK
        assert code(admin.ListSites, pb.ListSitesRequest(), READ) == grpc.StatusCode.OK
        assert code(admin.ListBatches, pb.ListBatchesRequest(), BATCH) == grpc.StatusCode.OK
        for token in (READ, BATCH):
            assert code(admin.AddModel, model, token) == grpc.StatusCode.PERMISSION_DENIED
            assert code(admin.AddSite, site, token) == grpc.StatusCode.PERMISSION_DENIED
        submit = pb.BatchSubmit(model="m", inputs=['{"inputs": []}'])
        assert code(admin.SubmitBatch, submit, READ) == grpc.StatusCode.PERMISSION_DENIED
        assert code(admin.SubmitBatch, submit, BATCH) != grpc.StatusCode.PERMISSION_DENIED
        assert code(admin.ListModels, pb.ListModelsRequest(), "made-up") == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert code(admin.AddSite, site, TOKEN) == grpc.StatusCode.OK


def test_site_addresses_the_control_plane_must_not_be_sent_to() -> None:
    for address in ("169.254.169.254:80", "[fe80::1]:80", "224.0.0.1:80", "[ff02::1]:80",
                    "255.255.255.255:80", "[::ffff:169.254.169.254]:80"):  # fmt: skip
        with pytest.raises(Refused):
            check_address("address", address, required=True)
    for address in ("127.0.0.1:8001", "[::1]:8001", "localhost:8001"):
        check_address("address", address, required=True)  # a control plane on loopback
        with pytest.raises(Refused, match="loopback"):
            check_address("address", address, required=True, allow_loopback=False)
    check_address("address", "10.1.2.3:8001", required=True, allow_loopback=False)


def registered(
    cp: ControlPlane, channel: grpc.Channel, site: str
) -> tuple[pb_grpc.AgentServiceStub, tuple[tuple[str, str], ...]]:
    """A site added, registered in region a: its AgentService stub and credentials."""
    metadata = (("authorization", f"Bearer {join_token(cp, site, 'a')}"),)
    agents = pb_grpc.AgentServiceStub(channel)
    agents.Register(
        pb.RegisterRequest(site_id=site, region="a", address="127.0.0.1:9"),
        metadata=metadata,
        timeout=10,
    )
    return agents, metadata


def test_a_report_that_is_not_one_is_refused(cp: ControlPlane) -> None:
    with grpc.insecure_channel(cp.address) as channel:
        agents, metadata = registered(cp, channel, "s1")
        bad = pb.LoadReport(
            site_id="s1", models=[pb.ModelLoad(name="m", rate_by_region={"a": float("inf")})]
        )
        with pytest.raises(grpc.RpcError) as err:
            agents.Report(iter([bad]), metadata=metadata, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a rate" in (err.value.details() or "")


def test_a_rotated_join_token_ends_the_open_report_stream(cp: ControlPlane) -> None:
    outbox: queue.Queue[pb.LoadReport | None] = queue.Queue()

    def reports() -> Iterator[pb.LoadReport]:
        while (report := outbox.get()) is not None:
            yield report

    def feed() -> None:
        for _ in range(100):  # 10 s of reports at most
            outbox.put(pb.LoadReport(site_id="s2"))
            time.sleep(0.1)
        outbox.put(None)

    with grpc.insecure_channel(cp.address) as channel:
        agents, metadata = registered(cp, channel, "s2")
        threading.Thread(target=feed, daemon=True).start()
        result: list[grpc.StatusCode] = []

        def stream() -> None:
            try:
                agents.Report(reports(), metadata=metadata, timeout=30)
                result.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                result.append(err.code())

        thread = threading.Thread(target=stream)
        thread.start()
        store = redis.Redis.from_url(cp.redis_url)
        wait_until(lambda: store.hexists("edgeplex:reports", "s2"), what="the stream's reports")
        rotated = time.monotonic()
        join_token(cp, "s2", "a")  # `site add` again: a new token, the old one revoked
        thread.join(15)
        assert result == [grpc.StatusCode.UNAUTHENTICATED]
        assert time.monotonic() - rotated < 5


def test_the_control_plane_refuses_clear_text_beyond_loopback(tmp_path: Path) -> None:
    env = {**os.environ, "EDGEPLEX_ADMIN_TOKEN": TOKEN}
    result = subprocess.run(
        [sys.executable, "-m", "edgeplex", "control-plane", "--grpc-host", "0.0.0.0",
         "--redis", "redis://127.0.0.1:1/0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "without TLS" in result.stdout + result.stderr


def test_a_usage_range_that_cuts_an_hour_kept_only_as_its_sum_is_refused(
    cp: ControlPlane,
) -> None:
    """Minutes sent over gRPC three days late; once the hour is sealed (the leader's
    upkeep, run here on the control plane's Redis, or by the leader itself: its
    minutes are past the 48 hours kept), a range on the hour is answered and one
    cutting it is refused, naming the hour."""
    hour = int(time.time() // 3600 - 72) * 3600
    with grpc.insecure_channel(cp.address) as channel:
        agents, metadata = registered(cp, channel, "s2")
        for n in range(3):
            record = pb.UsageRecord(tenant="acme", model="m", version="1", requests=5)
            minute = pb.UsageReport(site_id="s2", minute=hour // 60 + n, interval_s=60,
                                    records=[record])  # fmt: skip
            agents.ReportUsage(minute, metadata=metadata, timeout=10)

        async def seal() -> None:
            store = Store(cp.redis_url)
            try:
                await store.usage.trim(time.time(), 3600, 400 * 86400)
            finally:
                await store.close()

        asyncio.run(seal())
        admin = pb_grpc.AdminServiceStub(channel)
        auth = (("authorization", f"Bearer {TOKEN}"),)
        whole = pb.UsageQuery(from_time=hour, to_time=hour + 3600, by="site")
        rows = admin.GetUsage(whole, metadata=auth, timeout=10).rows
        assert [(r.key, r.requests) for r in rows] == [("s2", 15)]
        with pytest.raises(grpc.RpcError) as err:
            cut = pb.UsageQuery(from_time=hour + 60, to_time=hour + 3600)
            admin.GetUsage(cut, metadata=auth, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        named = time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(hour))
        assert f"the minutes of {named} are no longer kept" in (err.value.details() or "")


def test_a_usage_table_beyond_grpc_s_default_message_size_reaches_the_cli(
    cp: ControlPlane,
) -> None:
    """70,000 tenants' usage in two minutes: the table (about 6 MB, over gRPC's
    default 4 MiB cap on what a client receives) reaches `edgeplex admin usage`."""
    hour = int(time.time() // 3600) * 3600
    with grpc.insecure_channel(cp.address) as channel:
        agents, metadata = registered(cp, channel, "s3")
        for n in range(2):
            minute = pb.UsageReport(site_id="s3", minute=hour // 60 + n, interval_s=60)
            for i in range(35_000):
                minute.records.add(
                    tenant=f"tenant-with-a-long-name-for-billing-{n}-{i:06d}", model="m",
                    version="1", requests=3, bytes_in=123_456, bytes_out=654_321,
                    compute_s=0.123, device_byte_seconds=1.5e9,
                )  # fmt: skip
            agents.ReportUsage(minute, metadata=metadata, timeout=30)
    out = subprocess.run(
        [sys.executable, "-m", "edgeplex", "admin", "--control-plane", cp.address, "--json",
         "usage", "--from", time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(hour))],
        env={**os.environ, "EDGEPLEX_ADMIN_TOKEN": TOKEN},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert len(rows) == 70_000 and {r["key"] for r in rows} == {"m:1"}


def test_a_starting_control_plane_moves_old_usage_and_its_leader_seals_and_sums_it(
    tmp_path: Path,
) -> None:
    """Minutes in the layout before hourly sums, three days old, in Redis before a
    control plane starts: it moves them into their hours, and as leader seals
    those hours (48 h of minutes are kept) and sums them over the fleet, by
    itself; GetUsage answers from the sums and refuses a range that cuts them."""
    hour = int(time.time() // 3600 - 72) * 3600
    r, m = RedisServer(tmp_path), Mosquitto(tmp_path)
    r.start()
    m.start()
    plane = ControlPlane(tmp_path, r, m.url())
    try:
        raw = redis.Redis(port=r.port)
        for site, n in (("a1", 0), ("a1", 1), ("b1", 0)):
            record = pb.UsageRecord(tenant="acme", model="m", version="1", requests=2 + n)
            report = pb.UsageReport(site_id=site, minute=hour // 60 + n, interval_s=60,
                                    records=[record])  # fmt: skip
            raw.hset("edgeplex:usage", f"{site}/{report.minute}", report.SerializeToString())
            raw.zadd("edgeplex:usage:minutes", {f"{site}/{report.minute}": hour + 60 * n})
        plane.start()
        wait_until(lambda: raw.zscore("edgeplex:usage:fleet", str(hour)) is not None, 30,
                   "the hour moved, sealed and summed by the leader")  # fmt: skip
        assert not raw.exists("edgeplex:usage", "edgeplex:usage:minutes")
        with grpc.insecure_channel(plane.address) as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            auth = (("authorization", f"Bearer {TOKEN}"),)
            query = pb.UsageQuery(from_time=hour, to_time=hour + 3600)
            rows = admin.GetUsage(query, metadata=auth, timeout=10).rows
            assert [(r.tenant, r.key, r.requests) for r in rows] == [("acme", "m:1", 7)]
            with pytest.raises(grpc.RpcError) as err:
                admin.GetUsage(pb.UsageQuery(from_time=hour + 60), metadata=auth, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        plane.stop()
        m.stop()
        r.stop()
