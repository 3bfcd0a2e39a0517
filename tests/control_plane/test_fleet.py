"""The control plane with real Redis, mosquitto, agents and clients.

One fleet per module: Redis and mosquitto (Debian binaries on free ports), a
control plane process, and two agents (regions a and b) with their own model
repositories, filled only by what the control plane tells them. Tests that
restart a component leave the fleet healthy for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator

import aiomqtt
import grpc
import numpy as np
import pytest
import redis
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.artifacts import sha256_of
from edgeplex.fleet import desired_topic, parse_mqtt_url, presence_topic
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import inference_pb2 as ipb
from edgeplex.proto import inference_pb2_grpc as ipb_grpc
from tests.conftest import AUTH, AgentProcess, free_port
from tests.services import TOKEN, ControlPlane, Mosquitto, RedisServer
from tests.support.fleet import Fleet, agent_tier, loaded_sets, rejected_messages
from tests.support.sequences import ACCUMULATE, running_sum, value_input
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def infer(agent: AgentProcess, model: str) -> np.ndarray:
    client = triton.InferenceServerClient(agent.grpc_url)
    x = np.ones((1, 32), dtype=np.float32)
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], client_timeout=10)
    return result.as_numpy("output")


def first_message(fleet: Fleet, topic: str, timeout: float = 5.0) -> bytes:
    """The first message a fresh subscriber to `topic` gets: the retained one, if
    the broker has one."""

    async def read() -> bytes:
        kwargs = parse_mqtt_url(fleet.mqtt.url()).client_kwargs()
        async with aiomqtt.Client(**kwargs) as client:  # type: ignore[arg-type]
            await client.subscribe(topic, qos=1)
            message = await asyncio.wait_for(anext(aiter(client.messages)), timeout)
            return bytes(message.payload)  # type: ignore[arg-type]

    return asyncio.run(read())


def presence(fleet: Fleet, site: str) -> bytes:
    """The retained presence message of `site`."""
    return first_message(fleet, presence_topic(site))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    r = RedisServer(workdir)
    r.start()
    m = Mosquitto(workdir)
    m.start()
    cp = ControlPlane(
        workdir,
        r,
        m.url(),
        EDGEPLEX_CP_REGION_LATENCY_MS='{"a,b": 30}',
        EDGEPLEX_CP_HTTP_PORT=str(free_port()),
    )
    cp.start()
    # A second replica, started by the test that kills the first; agents know both.
    standby = ControlPlane(workdir, r, m.url())
    f = Fleet(workdir, r, m, cp, standby)
    src = workdir / "src"
    for i, name in enumerate(("base", "hot", "other")):
        demo.make_mlp(src / name, width=64, layers=2, in_width=32, seed=i)
        f.artifacts[name] = src / name / "1" / "model.onnx"
    f.start_agent("a1", "a")
    f.start_agent("b1", "b")
    f.add_model("base", f.artifacts["base"], min_replicas=2)
    f.add_model("other", f.artifacts["other"])
    try:
        yield f
    finally:
        for agent in f.agents.values():
            agent.stop()
        f.cp.stop()
        m.stop()
        r.stop()


def test_agents_join_and_load_what_placement_says(fleet: Fleet) -> None:
    wait_until(
        lambda: fleet.loaded_at("a1") >= {"base"} and fleet.loaded_at("b1") >= {"base"},
        what="base placed at both sites",
    )
    for site in ("a1", "b1"):
        agent = fleet.agents[site]
        wait_until(lambda a=agent: agent_tier(a, "base") == "loaded", what=f"base loaded at {site}")
        assert infer(agent, "base").shape == (1, 64)
        # Placed: a model only a request asks for there takes no room from it.
        _, body = agent.http_get("/edgeplex/v1/status")
        assert {e["name"]: e["placed"] for e in json.loads(body)}["base"] is True
    sites = fleet.call("ListSites", pb.ListSitesRequest()).sites  # type: ignore[attr-defined]
    assert {(s.site_id, s.region, s.up) for s in sites} == {("a1", "a", True), ("b1", "b", True)}
    lines = fleet.call("ExplainPlacement", pb.ModelName(name="base")).lines  # type: ignore[attr-defined]
    assert any(line.startswith("a1 (a): loaded") for line in lines)


def test_tenants_reach_every_site_in_the_signed_desired_state(fleet: Fleet) -> None:
    """A tenant and its key added at the control plane work at each site, which
    looks the key up locally; its model list holds there; removed, the sites are
    open again (no tenant: anonymous access, as before)."""
    fleet.call("AddTenant", pb.TenantSpec(name="acme", models=["base"]))
    issued = fleet.call("IssueTenantKey", pb.TenantName(name="acme"))
    key = issued.key  # type: ignore[attr-defined]
    listed = fleet.call("GetTenant", pb.TenantName(name="acme"))
    assert [k.id for k in listed.keys] == [issued.key_id]  # type: ignore[attr-defined]
    stored = redis.Redis.from_url(fleet.redis.url).get("edgeplex:tenants")
    assert stored and key.encode() not in stored  # its hash only
    agent = fleet.agents["a1"]
    client = triton.InferenceServerClient(agent.grpc_url)
    tensor = triton.InferInput("input", [1, 32], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 32), np.float32))

    def status(model: str, headers: dict[str, str] | None = None) -> str:
        try:
            client.infer(model, [tensor], headers=headers, client_timeout=10)
        except InferenceServerException as exc:
            return str(exc.status())
        return "OK"

    auth = {"authorization": f"Bearer {key}"}
    try:
        # A fleet-wide rate: each site's part follows its share of acme's requests.
        fleet.call("UpdateTenant", pb.TenantSpec(name="acme", fleet_rate=100.0))
        wait_until(lambda: status("base") == "StatusCode.UNAUTHENTICATED", what="tenants at a1")
        wait_until(lambda: status("base", auth) == "OK", what="acme's key at a1")
        assert status("other", auth) == "StatusCode.PERMISSION_DENIED"
        for _ in range(5):
            assert status("base", auth) == "OK"

        # Usage: the site's closed minutes reach the control plane, each request once.
        def used() -> pb.UsageRow | None:
            table = fleet.call("GetUsage", pb.UsageQuery(tenant="acme", by="site"))
            rows = [r for r in table.rows if r.key == "a1"]  # type: ignore[attr-defined]
            return rows[0] if rows and rows[0].requests >= 7 else None

        row = wait_until(used, what="acme's usage at a1")
        assert row.failures == 1 and row.requests >= 7, row  # type: ignore[union-attr]
        served = row.requests - row.failures  # type: ignore[union-attr]
        assert row.bytes_in == served * 32 * 4 and row.compute_s > 0, row  # type: ignore[union-attr]
        assert row.device_byte_seconds > 0, row  # type: ignore[union-attr]

        def rates() -> dict[str, float] | None:
            desired = redis.Redis.from_url(fleet.redis.url).hgetall("edgeplex:desired")
            found = {}
            for site, raw in desired.items():
                table = json.loads(pb.DesiredState.FromString(raw).tenants_json or "[]")
                found[site.decode()] = next(t["rate"] for t in table if t["name"] == "acme")
            return found if found.get("a1", 0) > 90 else None

        split = wait_until(rates, what="acme's fleet rate split toward a1")
        assert split == {"a1": 95.0, "b1": 4.8}, split  # b1: the floor
    finally:
        fleet.call("RemoveTenant", pb.TenantName(name="acme"))
        wait_until(lambda: status("base") == "OK", what="a1 open again")
        client.close()


def test_health_and_metrics(fleet: Fleet) -> None:
    port = fleet.cp.env["EDGEPLEX_CP_HTTP_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        assert json.load(reply) == {"redis": True, "leader": True}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    reports = [ln for ln in text.splitlines() if ln.startswith("edgeplex_cp_reports_total ")]
    assert reports and float(reports[0].split()[1]) > 0
    assert "edgeplex_cp_leader 1.0" in text


def test_admin_api_requires_the_token(fleet: Fleet) -> None:
    stub = fleet.admin()
    for metadata in ([], [("authorization", "Bearer wrong")]):
        with pytest.raises(grpc.RpcError) as info:
            stub.ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    env = {k: v for k, v in os.environ.items() if k != "EDGEPLEX_ADMIN_TOKEN"}
    cli = [sys.executable, "-m", "edgeplex", "admin", "--control-plane", fleet.cp.address]
    denied = subprocess.run([*cli, "model", "list"], env=env, capture_output=True, text=True)
    assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr
    ok = subprocess.run(
        [*cli, "model", "list"], env={**env, "EDGEPLEX_ADMIN_TOKEN": TOKEN},
        capture_output=True, text=True,
    )  # fmt: skip
    assert ok.returncode == 0 and "base" in ok.stdout
    # Global options after the noun and verb too; --json there gives JSON.
    late = subprocess.run(
        [sys.executable, "-m", "edgeplex", "admin", "model", "list", "--json",
         "--control-plane", fleet.cp.address],
        env={**env, "EDGEPLEX_ADMIN_TOKEN": TOKEN}, capture_output=True, text=True,
    )  # fmt: skip
    assert late.returncode == 0, late.stderr
    assert any(m["name"] == "base" for m in json.loads(late.stdout)["models"]), late.stdout


def test_bad_artifacts_end_failed_with_the_reason(fleet: Fleet) -> None:
    good = fleet.artifacts["other"]
    # A model nobody cached yet (the cache is content-addressed: bytes already
    # verified under a hash are used without a download).
    demo.make_mlp(fleet.workdir / "fresh", width=64, layers=2, in_width=32, seed=9)
    fresh = fleet.workdir / "fresh" / "1" / "model.onnx"
    truncated = fleet.workdir / "truncated.onnx"
    truncated.write_bytes(fresh.read_bytes()[:-100])
    garbage = fleet.workdir / "garbage.onnx"
    garbage.write_bytes(b"this is not a model" * 100)
    fleet.add_model("wrong_sha", good, sha="0" * 64)
    fleet.add_model("truncated", truncated, sha=sha256_of(fresh))
    fleet.add_model("not_onnx", garbage)
    with pytest.raises(grpc.RpcError) as info:
        fleet.call(
            "AddModel", pb.CatalogModel(name="bad", artifact_uri="ftp://x/y", sha256="0" * 64)
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        fleet.call(
            "AddModel",
            pb.CatalogModel(
                name="bad",
                artifact_uri=good.as_uri(),
                sha256=sha256_of(good),
                variants=["int4"],
                quality="approx",
            ),
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "variants: unknown ['int4']" in info.value.details()
    assert "quality: exact or any" in info.value.details()

    def state(name: str) -> pb.CatalogModel:
        return fleet.model(name).model

    for name, reason in (
        ("wrong_sha", "sha256 mismatch"),
        ("truncated", "sha256 mismatch"),
        ("not_onnx", "not a loadable ONNX model"),
    ):
        wait_until(lambda n=name: state(n).state == "FAILED", what=f"{name} FAILED")
        assert reason in state(name).reason
        assert str(fleet.workdir) not in state(name).reason  # no local paths leak
    assert state("base").state == "READY"
    assert infer(fleet.agents["a1"], "base").shape == (1, 64)  # nothing else disturbed
    for name in ("wrong_sha", "truncated", "not_onnx"):
        fleet.call("RemoveModel", pb.ModelName(name=name))


def test_placement_follows_a_rise_in_regional_demand(fleet: Fleet) -> None:
    fleet.add_model("hot", fleet.artifacts["hot"])
    wait_until(lambda: fleet.model("hot").model.state == "READY", what="hot READY")
    assert "hot" not in fleet.loaded_at("a1")  # no demand yet
    a1 = fleet.agents["a1"]
    stop = time.monotonic() + 30
    while time.monotonic() < stop and "hot" not in fleet.loaded_at("a1"):
        # Not here yet: NOT_FOUND, but counted as region a's demand.
        with contextlib.suppress(triton.InferenceServerException):
            infer(a1, "hot")
        time.sleep(0.02)
    assert "hot" in fleet.loaded_at("a1")
    assert "hot" not in fleet.loaded_at("b1")  # region b has no demand for it
    wait_until(lambda: agent_tier(a1, "hot") == "loaded", what="hot loaded at a1")
    assert infer(a1, "hot").shape == (1, 64)


class Hammer:
    """Requests against one model in a thread; counts failures."""

    def __init__(self, agent: AgentProcess, model: str) -> None:
        self.agent, self.model = agent, model
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                infer(self.agent, self.model)
                self.ok += 1
            except Exception as exc:
                self.failures.append(str(exc))
            time.sleep(0.01)

    def __enter__(self) -> Hammer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def placed_models_asked_for(fleet: Fleet, placement: pb.Placement) -> Iterator[list[Hammer]]:
    """Requests for every model `placement` holds but base, each at its holder, while
    the block runs: their demand goes on, so a round places them where they are.
    (Demand an earlier test left behind decays, a half-life of 2 s here, and moves
    its model when it falls below the floor, whatever the test is doing.)"""
    hammers = [
        Hammer(fleet.agents[s.site_id], name)
        for s in placement.sites
        for name in s.loaded
        if name != "base"
    ]
    with contextlib.ExitStack() as running:
        for hammer in hammers:
            running.enter_context(hammer)
        yield hammers


def test_control_plane_killed_and_restarted_loses_nothing(fleet: Fleet) -> None:
    # Demand for every placed model goes on through the restart, so the round
    # after it must place what the round before it did.
    before = fleet.placement()
    models_before = {m.name for m in fleet.call("ListModels", pb.ListModelsRequest()).models}  # type: ignore[attr-defined]
    with (
        placed_models_asked_for(fleet, before),
        Hammer(fleet.agents["b1"], "base") as hammer,
    ):
        fleet.cp.stop(signal.SIGKILL)
        time.sleep(1.0)
        fleet.cp.start()
        after = wait_until(
            lambda: (p := fleet.placement()).version > before.version and p, what="a new round"
        )
        time.sleep(0.5)
    assert hammer.failures == [] and hammer.ok > 20
    models_after = {m.name for m in fleet.call("ListModels", pb.ListModelsRequest()).models}  # type: ignore[attr-defined]
    assert models_after == models_before
    assert {s.site_id: set(s.loaded) for s in after.sites} == {  # type: ignore[attr-defined]
        s.site_id: set(s.loaded) for s in before.sites
    }


def test_a_control_plane_stops_in_time_on_sigterm(fleet: Fleet) -> None:
    """SIGTERM with the agents' streams open, the dashboard served and placement
    running: every step of the stop ends in its time and the process exits 0 (a
    step cut off would be named in the log, `shutdown: ...`)."""
    before = fleet.placement()
    process = fleet.cp.process
    assert process is not None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    took = time.monotonic() - started
    log = fleet.cp.log()
    stop = log[log.rindex("shutting down") :]
    assert "stopped" in stop and "shutdown:" not in stop, stop
    assert took < 12.0, took
    fleet.cp.process = None
    fleet.cp.start()
    wait_until(lambda: fleet.placement().version > before.version, what="a round after the start")


def test_redis_restart_and_loss_of_registrations(fleet: Fleet) -> None:
    with Hammer(fleet.agents["a1"], "base") as hammer:
        fleet.redis.restart()
        wait_until(lambda: fleet.call("ListModels", pb.ListModelsRequest()), what="admin API back")
        v = fleet.placement().version
        wait_until(lambda: fleet.placement().version > v, what="placement after Redis restart")
        # Registrations wiped (a Redis without persistence, say): agents register again.
        client = redis.Redis.from_url(fleet.redis.url)
        client.delete("edgeplex:sites")
        wait_until(
            lambda: (
                client.hexists("edgeplex:sites", "a1") and client.hexists("edgeplex:sites", "b1")
            ),
            what="agents registered again",
        )
    assert hammer.failures == []


def test_a_centre_paused_past_the_site_lease_marks_no_site_down(fleet: Fleet) -> None:
    """The control plane and Redis stop together (SIGSTOP: the edge cut off from the
    centre, a paused VM) for longer than a site lease. When they run again every
    site's last report is older than its lease, but the silence was the centre's
    own: no site is marked down, nothing moves, and the agents serve throughout."""
    if fleet.redis.process is None or fleet.cp.process is None:
        pytest.skip("Redis runs in a container here: this test stops processes")
    before = fleet.settled_placement()
    logged = len(fleet.cp.log())
    paused = [fleet.cp.process.pid, fleet.redis.process.pid]
    with placed_models_asked_for(fleet, before), Hammer(fleet.agents["a1"], "base") as hammer:
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(3 + 3)  # the site lease (3 s here), and as long again
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        wait_until(lambda: fleet.placement().version > before.version, what="a round after")
        after = fleet.settled_placement()
    log = fleet.cp.log()[logged:]
    assert "lease lapsed" not in log, log
    assert all(s.up for s in fleet.call("ListSites", pb.ListSitesRequest()).sites)  # type: ignore[attr-defined]
    assert loaded_sets(after) == loaded_sets(before)
    assert hammer.failures == [] and hammer.ok > 20


def test_broker_restart_agents_resubscribe_and_get_retained_state(fleet: Fleet) -> None:
    fleet.mqtt.stop()
    fleet.add_model("other", fleet.artifacts["other"], pin=True)  # placed everywhere
    wait_until(
        lambda: "other" in fleet.loaded_at("a1") and "other" in fleet.loaded_at("b1"),
        what="other placed everywhere",
    )
    time.sleep(1.0)
    assert agent_tier(fleet.agents["a1"], "other") == ""  # the broker is down: not heard yet
    fleet.mqtt.start()
    for site in ("a1", "b1"):
        wait_until(
            lambda s=site: agent_tier(fleet.agents[s], "other") == "loaded",
            timeout=30,
            what=f"other loaded at {site} after the broker came back",
        )


def test_a_broker_back_without_its_store_has_every_desired_state_again(fleet: Fleet) -> None:
    """A broker that comes back without its retained messages (killed, its store
    lost) has every site's desired state again as soon as the leader reconnects,
    with nothing changed meanwhile: a site starting then finds its own. Before, an
    idle leader noticed the lost connection only at its next message, which in a
    quiet fleet is the re-signing a third of the message lifetime later."""
    fleet.settled_placement()  # nothing left to publish
    fleet.mqtt.stop(signal.SIGKILL)
    (fleet.mqtt.workdir / "mosquitto.db").unlink()
    fleet.mqtt.start()
    started = time.monotonic()
    for site in ("a1", "b1"):
        assert first_message(fleet, desired_topic(site), timeout=10)
    assert time.monotonic() - started < 5


def test_a_dead_site_is_marked_down_and_its_models_move(fleet: Fleet) -> None:
    fleet.add_model("hot", fleet.artifacts["hot"], min_replicas=1)
    wait_until(lambda: "hot" in fleet.loaded_at("a1") | fleet.loaded_at("b1"), what="hot placed")
    holder = "a1" if "hot" in fleet.loaded_at("a1") else "b1"
    survivor = "b1" if holder == "a1" else "a1"
    assert presence(fleet, holder) == b"online"
    fleet.agents[holder].process.send_signal(signal.SIGKILL)
    fleet.agents[holder].process.wait()
    started = time.monotonic()
    wait_until(lambda: "hot" in fleet.loaded_at(survivor), timeout=15, what="hot moved")
    moved_after = time.monotonic() - started
    sites = {s.site_id: s for s in fleet.call("ListSites", pb.ListSitesRequest()).sites}  # type: ignore[attr-defined]
    assert not sites[holder].up
    assert presence(fleet, holder) == b"offline"  # the broker sent its last will
    assert moved_after < 3 + 1 + 2  # site lease + placement period + slack
    wait_until(lambda: agent_tier(fleet.agents[survivor], "hot") == "loaded", what="hot served")
    assert infer(fleet.agents[survivor], "hot").shape == (1, 64)
    region = "a" if holder == "a1" else "b"
    fleet.start_agent(holder, region)  # rejoins and reconciles
    wait_until(
        lambda: {s.site_id: s.up for s in fleet.call("ListSites", pb.ListSitesRequest()).sites}[
            holder
        ],  # type: ignore[attr-defined]
        what="site back up",
    )


def test_a_standby_replica_takes_over_when_the_leader_dies(fleet: Fleet) -> None:
    """The standby takes the lease; the agents, which know both replicas, move to it
    before their site leases lapse, so no site is marked down and nothing moves; a
    site whose lists did not change keeps the desired state it was sent (the same
    version: the new leader rebuilds it from the head and models' sha256 in Redis);
    and the usage of the requests served across the takeover is counted once each.
    Every other placed model is asked for where it is placed throughout, as in the
    restart test above."""
    standby = fleet.standby
    assert standby is not None
    standby.start()

    def sent() -> dict[str, int]:
        heads = redis.Redis.from_url(fleet.redis.url).hgetall("edgeplex:desired")
        return {k.decode(): pb.DesiredState.FromString(v).version for k, v in heads.items()}

    def lists(placement: pb.Placement) -> dict[str, tuple[list[str], list[str]]]:
        return {sp.site_id: (list(sp.loaded), list(sp.staged)) for sp in placement.sites}

    def explain(name: str) -> list[str]:
        return list(fleet.call("ExplainPlacement", pb.ModelName(name=name), standby).lines)  # type: ignore[attr-defined]

    def used_of_base(cp: ControlPlane) -> int:  # only the hammer at a1 asks for it here
        table = fleet.call("GetUsage", pb.UsageQuery(tenant="anonymous", by="model"), cp)
        return sum(r.requests for r in table.rows if r.key.partition(":")[0] == "base")  # type: ignore[attr-defined]

    try:
        # Every earlier minute sent first.
        wait_until(lambda: fleet.journals_sent("a1", "b1"), what="the journals sent")
        used_before = used_of_base(fleet.cp)
        with placed_models_asked_for(fleet, fleet.placement()) as kept_up:
            before = fleet.settled_placement()
            assert before.leader == fleet.cp.replica  # type: ignore[attr-defined]
            sent_before = sent()
            assert set(sent_before) == {"a1", "b1"}, sent_before
            with Hammer(fleet.agents["a1"], "base") as hammer:
                fleet.cp.stop(signal.SIGKILL)
                killed = time.monotonic()
                after = fleet.standby_leads()
                # The leader lease, the new leader's settling window (until every site
                # has reported to it), a round, and slack.
                assert time.monotonic() - killed < 2 + 2 + 1 + 1.5
            now = fleet.call("GetPlacement", pb.PlacementRequest(), standby)
            same = {s for s, held in lists(now).items() if lists(before).get(s) == held}  # type: ignore[arg-type]
            assert same, (before, now)
            assert {s: sent()[s] for s in same} == {s: sent_before[s] for s in same}
            if loaded_sets(after) != loaded_sets(before):  # say why, from the leader
                why = {name: explain(name) for sp in before.sites for name in sp.loaded}  # type: ignore[attr-defined]
                pytest.fail(f"placement moved at the takeover: {before} -> {after}; {why}")
        assert hammer.failures == [] and hammer.ok > 20
        assert all(h.failures == [] for h in kept_up), [h.failures[:3] for h in kept_up]
        assert all(s.up for s in fleet.call("ListSites", pb.ListSitesRequest(), standby).sites)  # type: ignore[attr-defined]
        expected = used_before + hammer.ok
        wait_until(lambda: used_of_base(standby) >= expected, what="usage across the takeover")
        # Every minute acknowledged and gone from the journals: none can be sent again.
        wait_until(lambda: fleet.journals_sent("a1", "b1"), what="the journals sent")
        assert used_of_base(standby) == expected
    finally:
        fleet.cp.start()  # back as a standby; the fleet stays usable
        standby.stop()


ACCESS_LINE = re.compile(r" (?:grpc|http) \S+ ([\w.-]+):\S+ status=(?:OK|200) .*tenant=(\S+) ")


def test_a_new_leader_sends_anew_a_state_redis_lost(fleet: Fleet) -> None:
    """Redis lost the head of the state a1 applied (a failover dropped the last write;
    here an older head is written over it). The standby, leading, would rebuild the
    older version from it and a1 refuse that as stale, keeping what it has while the
    leader thought it sent something else; a1 reports the version it applied, so the
    new leader sends a1 its state anew, and a1 refuses nothing."""
    standby = fleet.standby
    assert standby is not None
    store = redis.Redis.from_url(fleet.redis.url)
    fleet.settled_placement()
    head = pb.DesiredState.FromString(store.hget("edgeplex:desired", "a1"))  # type: ignore[arg-type]
    applied = head.version
    rejected_before = rejected_messages(fleet.agents["a1"])
    standby.start()
    try:
        older = pb.DesiredState()
        older.CopyFrom(head)
        older.version, older.issued_at = applied - 1, head.issued_at - 1
        fleet.cp.stop(signal.SIGKILL)  # no round of its own after the write below
        store.hset("edgeplex:desired", "a1", older.SerializeToString())
        fleet.standby_leads()

        def sent_anew() -> int | None:
            raw = store.hget("edgeplex:desired", "a1")
            version = pb.DesiredState.FromString(raw).version  # type: ignore[arg-type]
            return version if version > applied else None

        sent = wait_until(sent_anew, timeout=15, what="a1 sent its state anew")

        def applied_or_refused() -> bool:  # as a1's reports say, or its refusals
            raw = store.hget("edgeplex:reports", "a1")
            report = pb.LoadReport.FromString(raw) if raw else pb.LoadReport()  # type: ignore[arg-type]
            refused = rejected_messages(fleet.agents["a1"]) != rejected_before
            return report.desired_version >= sent or refused

        wait_until(applied_or_refused, timeout=15, what="a1 applied or refused its state")
        assert rejected_messages(fleet.agents["a1"]) == rejected_before
    finally:
        fleet.first_replica_leads_again()


def served_in_access_log(log: str) -> Counter[tuple[str, str]]:
    """Successes an agent served itself (forwards it passed on excluded), by
    (tenant, model), as its access lines say."""
    found: Counter[tuple[str, str]] = Counter()
    for line in log.splitlines():
        if "forwarded_to=" not in line and (match := ACCESS_LINE.search(line)):
            found[(match[2], match[1])] += 1
    return found


class Caller:
    """One tenant's closed-loop caller of one model at one site (whichever process
    serves the site now), counting what it was answered."""

    def __init__(self, fleet: Fleet, site: str, model: str, tenant: str, key: str) -> None:
        self.fleet, self.site, self.model, self.tenant = fleet, site, model, tenant
        self.headers = {"authorization": f"Bearer {key}"}
        self.ok = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tensor = triton.InferInput("input", [1, 32], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 32), np.float32))
        agent, client = None, None
        while not self._stop.is_set():
            if agent is not self.fleet.agents[self.site]:  # restarted: its new ports
                agent = self.fleet.agents[self.site]
                client = triton.InferenceServerClient(agent.grpc_url)
            try:
                client.infer(self.model, [tensor], headers=self.headers, client_timeout=5)  # type: ignore[union-attr]
                self.ok += 1
            except InferenceServerException:
                time.sleep(0.05)
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_usage_is_exact_across_tenants_forwarding_a_killed_agent_and_a_failover(
    fleet: Fleet,
) -> None:
    """Two tenants call a model only b1 holds, through a1 (forwarded) and at b1, and
    a model each site holds, at both. Mid-traffic b1 is SIGKILLed and restarted,
    then the leading control plane is killed and its standby takes over. Per tenant
    and model, the usage the control plane ends with is at least the successes the
    serving agents' access logs show (a request is counted before its answer
    leaves, so none answered goes unbilled) and exceeds them by at most the
    requests in flight to b1 at the kill: those its batcher counted as answered
    just before the SIGKILL, whose access line and answer never came. A minute
    sent twice would add hundreds; it is stored in the same place, so adds none."""
    standby = fleet.standby
    assert standby is not None
    fleet.add_model("billed", fleet.artifacts["hot"], regions=["b"], min_replicas=1)
    wait_until(lambda: "billed" in fleet.loaded_at("b1"), what="billed placed at b1")
    keys = {}
    for tenant in ("red", "blue"):
        fleet.call("AddTenant", pb.TenantSpec(name=tenant))
        keys[tenant] = fleet.call("IssueTenantKey", pb.TenantName(name=tenant)).key  # type: ignore[attr-defined]
    killed_b1 = fleet.agents["b1"]
    try:
        standby.start()
        for site in ("a1", "b1"):  # the tenants reach both sites; each key then works
            client = triton.InferenceServerClient(fleet.agents[site].grpc_url)
            tensor = triton.InferInput("input", [1, 32], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 32), np.float32))

            def refused_anonymous() -> bool:
                try:
                    client.infer("base", [tensor], client_timeout=5)  # noqa: B023
                except InferenceServerException:
                    return True
                return False

            wait_until(refused_anonymous, what=f"tenants at {site}")
        callers = [
            Caller(fleet, site, model, tenant, keys[tenant])
            for tenant in ("red", "blue")
            for site, model in (("a1", "billed"), ("b1", "billed"), ("a1", "base"), ("b1", "base"))
        ]
        try:
            wait_until(lambda: all(c.ok >= 5 for c in callers), what="every caller served")
            wait_until(lambda: not fleet.journals_sent("b1"), what="a minute open at b1")
            killed_b1.process.kill()  # mid-minute: its journal's minute file still open
            killed_b1.process.wait()
            fleet.start_agent("b1", "b")
            wait_until(lambda: "billed" in fleet.loaded_at("b1"), what="billed back at b1")
            served_again = {id(c): c.ok for c in callers}
            wait_until(
                lambda: all(c.ok >= served_again[id(c)] + 5 for c in callers),
                timeout=30, what="every caller served by the restarted b1",
            )  # fmt: skip
            fleet.cp.stop(signal.SIGKILL)
            fleet.standby_leads()
            served_before = {id(c): c.ok for c in callers}
            wait_until(
                lambda: all(c.ok >= served_before[id(c)] + 5 for c in callers),
                what="every caller served under the new leader",
            )  # fmt: skip
        finally:
            for caller in callers:
                caller.stop()
        logs = killed_b1.log() + fleet.agents["b1"].log() + fleet.agents["a1"].log()
        # This test's tenants: the agents' logs may hold earlier tests' (a1's does
        # after the tenants test, when nothing restarted it between).
        served = {k: n for k, n in served_in_access_log(logs).items() if k[0] in keys}
        clients: Counter[tuple[str, str]] = Counter()
        for caller in callers:
            clients[(caller.tenant, caller.model)] += caller.ok

        def usage() -> Counter[tuple[str, str]]:
            table = fleet.call("GetUsage", pb.UsageQuery(by="model"), standby)
            found: Counter[tuple[str, str]] = Counter()
            for row in table.rows:  # type: ignore[attr-defined]
                if row.tenant in keys:
                    found[(row.tenant, row.key.split(":")[0])] += row.requests - row.failures
            return found

        wait_until(
            lambda: all(usage()[k] >= n for k, n in served.items()),
            timeout=30, what="every minute's usage at the new leader",
        )  # fmt: skip
        # Every minute acknowledged and gone from both journals: none can be sent again.
        wait_until(lambda: fleet.journals_sent("a1", "b1"), timeout=30, what="both journals sent")
        final = usage()
        assert set(served) == {(t, m) for t in keys for m in ("billed", "base")}, served
        assert set(final) == set(served), (final, served)
        at_b1 = {"billed": 2, "base": 1}  # each tenant's callers of b1 (billed: via a1 too)
        for pair, count in served.items():
            assert 0 <= final[pair] - count <= at_b1[pair[1]], (pair, final[pair], count)
            assert 0 <= count - clients[pair] <= at_b1[pair[1]], (pair, count, clients[pair])
    finally:
        fleet.first_replica_leads_again()
        for tenant in keys:
            fleet.call("RemoveTenant", pb.TenantName(name=tenant))
        fleet.call("RemoveModel", pb.ModelName(name="billed"))

        def open_again() -> bool:
            with contextlib.suppress(InferenceServerException):
                return all(infer(fleet.agents[s], "base") is not None for s in ("a1", "b1"))
            return False

        wait_until(open_again, what="both sites open to anonymous requests again")


def test_forwarding_to_the_site_that_holds_the_model(fleet: Fleet) -> None:
    fleet.add_model("b_only", fleet.artifacts["other"], regions=["b"], min_replicas=1)
    wait_until(lambda: "b_only" in fleet.loaded_at("b1"), what="b_only placed at b1")
    a1, b1 = fleet.agents["a1"], fleet.agents["b1"]
    wait_until(lambda: agent_tier(b1, "b_only") == "loaded", what="b_only loaded at b1")

    def served_by_grpc() -> str:
        # tritonclient does not expose trailers; the raw stub does.
        request = ipb.ModelInferRequest(model_name="b_only")
        request.inputs.add(name="input", datatype="FP32", shape=[1, 32])
        request.raw_input_contents.append(np.ones((1, 32), np.float32).tobytes())
        with grpc.insecure_channel(a1.grpc_url) as channel:
            stub = ipb_grpc.GRPCInferenceServiceStub(channel)
            response, call = stub.ModelInfer.with_call(request, timeout=10)
        assert response.model_name == "b_only"
        return dict(call.trailing_metadata())["edgeplex-served-by"]

    assert wait_until(lambda: served_by_grpc() == "b1", what="a1 forwards over gRPC to b1")
    # Described at a site that forwards its requests: a1 asks b1 for its metadata,
    # config and readiness, over either protocol.
    client = triton.InferenceServerClient(a1.grpc_url)
    metadata = client.get_model_metadata("b_only")
    assert metadata.name == "b_only" and [t.name for t in metadata.inputs] == ["input"]
    assert client.get_model_config("b_only").config.name == "b_only"
    assert client.is_model_ready("b_only") and not client.is_model_ready("b_only", "7")
    with pytest.raises(InferenceServerException, match="'b_only' version 7 is not found"):
        client.get_model_metadata("b_only", "7")  # b1's own answer, NOT_FOUND
    client.close()
    for path in ("/v2/models/b_only", "/v2/models/b_only/config"):
        status, reply = a1.http_get(path)
        assert status == 200 and json.loads(reply)["name"] == "b_only", reply
    assert a1.http_get("/v2/models/b_only/ready")[0] == 200
    assert a1.http_get("/v2/models/b_only/versions/7/ready")[0] == 404
    assert a1.http_get("/v2/models/nowhere")[0] == 404  # no site holds it
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": [1.0] * 32}]}
    ).encode()
    status, headers, reply = http_post(a1, "/v2/models/b_only/infer", body)
    assert status == 200 and headers["edgeplex-served-by"] == "b1"
    assert len(json.loads(reply)["outputs"][0]["data"]) == 64
    # The caller's trace crosses the forward: both sites' access lines name it.
    trace = "0af7651916cd43dd8448eb211c80319c"
    parent = {"traceparent": f"00-{trace}-b7ad6b7169203331-01"}
    status, headers, _ = http_post(a1, "/v2/models/b_only/infer", body, parent)
    assert status == 200 and headers["edgeplex-served-by"] == "b1"
    wait_until(lambda: f"trace={trace}" in b1.log(), what="b1's access line with the trace")
    assert any(
        "forwarded_to=b1" in line and f"trace={trace}" in line for line in a1.log().splitlines()
    ), a1.log()[-2000:]
    # Served locally: the header names the site itself.
    status, headers, _ = http_post(b1, "/v2/models/b_only/infer", body)
    assert status == 200 and headers["edgeplex-served-by"] == "b1"
    # A request a peer forwarded (it carries the fleet's peer token) is never forwarded
    # again; from anyone else the hop header is ignored.
    token = redis.Redis.from_url(fleet.redis.url).get("edgeplex:peer_token").decode()
    hop = {"edgeplex-forwarded": "x9", "edgeplex-peer-token": token}
    status, headers, reply = http_post(a1, "/v2/models/b_only/infer", body, hop)
    assert status == 503 and b"not at this site" in reply
    assert headers["edgeplex-not-here"] == "1"  # the forwarder routes it again
    spoofed = {"edgeplex-forwarded": "x9", "edgeplex-peer-token": "guess"}
    status, headers, reply = http_post(a1, "/v2/models/b_only/infer", body, spoofed)
    assert status == 200 and headers["edgeplex-served-by"] == "b1"
    # Not in the fleet's catalog: 404 / NOT_FOUND, saying so.
    status, headers, reply = http_post(a1, "/v2/models/nowhere/infer", body)
    assert status == 404 and b"not in the fleet's catalog" in reply
    with pytest.raises(triton.InferenceServerException) as info:
        infer(a1, "nowhere")
    assert "NOT_FOUND" in str(info.value.status())


def test_a_sequence_begun_at_a_peer_goes_on_there_once_the_model_is_here_too(
    fleet: Fleet,
) -> None:
    """A stateful model's sequence that a1 forwarded to b1 (b1 alone held the model)
    goes on at b1, where its state is, after placement brings the model to a1 too;
    a1 serves the sequences that begin there."""
    src = fleet.workdir / "acc"
    config = ACCUMULATE.replace('"accumulate"', '"acc"').replace("500000", "120000000")
    running_sum(src, config)  # a running sum; a sequence idles out after 120 s
    archive = fleet.workdir / "acc.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "1" / "model.onnx", "model.onnx")
        tar.add(src / "config.pbtxt", "config.pbtxt")
    fleet.add_model("acc", archive, regions=["b"], min_replicas=1)
    a1, b1 = fleet.agents["a1"], fleet.agents["b1"]
    wait_until(lambda: agent_tier(b1, "acc") == "loaded", what="acc loaded at b1")
    client = triton.InferenceServerClient(a1.grpc_url)

    def send(value: int, sequence: int = 7, **flags: bool) -> int:
        tensor = value_input(triton, value)
        result = client.infer("acc", [tensor], sequence_id=sequence, **flags)
        return int(result.as_numpy("OUTPUT")[0][0])

    def started() -> bool:
        try:
            return send(5, sequence_start=True) == 5
        except InferenceServerException:  # a1 has no route to acc yet
            return False

    def post(value: int, **parameters: object) -> int:  # the same over HTTP, sequence 9
        tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}
        body = {"inputs": [tensor], "parameters": {"sequence_id": 9, **parameters}}
        status, _, reply = http_post(a1, "/v2/models/acc/infer", json.dumps(body).encode())
        assert status == 200, reply
        return int(json.loads(reply)["outputs"][0]["data"][0])

    def b1_post(sequence: int, value: int, **parameters: object) -> tuple[int, str]:
        tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}
        body = {"inputs": [tensor], "parameters": {"sequence_id": sequence, **parameters}}
        status, headers, reply = http_post(b1, "/v2/models/acc/infer", json.dumps(body).encode())
        assert status == 200, reply
        return int(json.loads(reply)["outputs"][0]["data"][0]), headers["edgeplex-served-by"]

    wait_until(started, what="a1 forwards the sequence's START to b1")
    assert post(10, sequence_start=True) == 10
    fleet.add_model("acc", archive, regions=["a", "b"], min_replicas=2)
    wait_until(lambda: agent_tier(a1, "acc") == "loaded", what="acc loaded at a1 too")
    assert send(3) == 8  # b1's state: the sequence went on there
    # A sequence at b1 whose model an operator sends to the cached tier there: its
    # next request at b1 is served there (its state is there), not sent to a1.
    assert b1_post(31, 6, sequence_start=True) == (6, "b1")
    demote = http_post(b1, "/edgeplex/v1/models/acc/demote", b'{"tier": "cached"}', AUTH)
    assert demote[0] == 200 and agent_tier(b1, "acc") == "cached"
    assert b1_post(31, 1, sequence_end=True) == (7, "b1")
    assert send(4, sequence_end=True) == 12
    assert post(1, sequence_end=True) == 11
    assert send(1, sequence=8, sequence_start=True) == 1  # begun at a1: served there
    assert send(2, sequence=8, sequence_end=True) == 3
    # A forwarded request in the middle of a sequence b1 has no state for: the error
    # a client would have, marked for the forwarder, which tries the other holders.
    token = redis.Redis.from_url(fleet.redis.url).get("edgeplex:peer_token").decode()
    hop = {"edgeplex-forwarded": "x9", "edgeplex-peer-token": token}
    tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}
    body = json.dumps({"inputs": [tensor], "parameters": {"sequence_id": 99}}).encode()
    status, headers, reply = http_post(b1, "/v2/models/acc/infer", body, hop)
    assert status == 400 and b"START" in reply and headers["edgeplex-sequence-not-here"] == "1"
    status, headers, reply = http_post(b1, "/v2/models/acc/infer", body)  # from a client
    assert status == 400 and b"START" in reply and "edgeplex-sequence-not-here" not in headers
    client.close()

    # Placement moves the model away from b1 during a sequence there: b1 serves it on,
    # with no cold start (its state is there; a peer nearer than a promotion would
    # have had the rest of the sequence, without that state), and lets the model go
    # when the sequence ends.
    def at_b1(value: int, **parameters: object) -> tuple[int, dict[str, str]]:
        tensor = {"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}
        body = {"inputs": [tensor], "parameters": {"sequence_id": 21, **parameters}}
        status, headers, reply = http_post(b1, "/v2/models/acc/infer", json.dumps(body).encode())
        assert status == 200, reply
        return int(json.loads(reply)["outputs"][0]["data"][0]), headers

    def acc_at_b1() -> dict[str, object]:
        entries = json.loads(b1.http_get("/edgeplex/v1/status")[1])
        return next(e for e in entries if e["name"] == "acc")

    def demoted() -> bool:  # at once, or once the sequence ends
        entry = acc_at_b1()
        return entry["intent"] == "staged" or entry["tier"] != "loaded"

    assert at_b1(2, sequence_start=True)[0] == 2
    fleet.add_model("acc", archive, regions=["a"], min_replicas=1)
    wait_until(lambda: not acc_at_b1()["placed"], what="b1 told acc is placed elsewhere")
    wait_until(demoted, what="b1 demotes acc")
    total, headers = at_b1(3)
    assert total == 5 and headers["edgeplex-served-by"] == "b1"
    assert "edgeplex-cold-start" not in headers
    assert at_b1(4, sequence_end=True)[0] == 9
    wait_until(lambda: acc_at_b1()["tier"] == "staged", what="acc leaves b1 once its sequence ends")
    (stats,) = json.loads(a1.http_get("/v2/models/acc/stats")[1])["model_stats"]
    assert stats["inference_stats"]["success"]["count"] == 2  # sequence 8's, run at a1

    # A forwarder's search probes holders for a tenant: a holder without the sequence
    # gives the tenant's rate token back, so probes never spend its rate there.
    fleet.call("AddTenant", pb.TenantSpec(name="seq", rate=0.001, burst=1))
    probe = {**hop, "authorization": f"Bearer {token}", "edgeplex-tenant": "seq"}
    try:
        wait_until(
            lambda: http_post(b1, "/v2/models/acc/infer", body)[0] == 401,
            what="tenants at b1",
        )  # fmt: skip
        for _ in range(3):  # one token, never spent
            status, headers, reply = http_post(b1, "/v2/models/acc/infer", body, probe)
            assert status == 400 and headers["edgeplex-sequence-not-here"] == "1", reply
    finally:
        fleet.call("RemoveTenant", pb.TenantName(name="seq"))
        wait_until(
            lambda: http_post(b1, "/v2/models/acc/infer", body)[0] == 400,
            what="b1 open again",
        )  # fmt: skip


def test_a_new_models_first_calls_succeed_at_any_site(fleet: Fleet) -> None:
    """A model just added to the catalog, placed nowhere yet: its first calls at a
    site succeed (fetched and loaded there on demand), concurrent ones included,
    and placement keeps it where it was loaded."""
    src = fleet.workdir / "src"
    for i, name in enumerate(("fresh", "fresh2")):
        demo.make_mlp(src / name, width=64, layers=2, in_width=32, seed=10 + i)
        fleet.add_model(name, src / name / "1" / "model.onnx")
    a1, b1 = fleet.agents["a1"], fleet.agents["b1"]
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": [1.0] * 32}]}
    ).encode()
    started = time.monotonic()
    status, headers, reply = http_post(a1, "/v2/models/fresh/infer", body)
    first_call_s = time.monotonic() - started
    assert status == 200, reply
    assert headers["edgeplex-served-by"] == "a1" and headers.get("edgeplex-cold-start")
    assert len(json.loads(reply)["outputs"][0]["data"]) == 64
    print(f"first call to a new model: {first_call_s * 1000:.0f} ms (fetch, verify, load, infer)")
    # Eight callers at once at the other site: one fetch, every call served.
    results: list[int] = []

    def call() -> None:
        results.append(http_post(b1, "/v2/models/fresh2/infer", body)[0])

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8
    # Bad input for a model not yet here: 400 naming the fault, after the fetch.
    bad = json.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32",
                                  "data": [1.0] * 3}]}).encode()  # fmt: skip
    demo.make_mlp(src / "fresh3", width=64, layers=2, in_width=32, seed=12)
    fleet.add_model("fresh3", src / "fresh3" / "1" / "model.onnx")
    status, _, reply = http_post(a1, "/v2/models/fresh3/infer", bad)
    assert status == 400 and b"input" in reply
    # Described before its first request: fetched as that request would fetch it.
    demo.make_mlp(src / "fresh4", width=64, layers=2, in_width=32, seed=13)
    fleet.add_model("fresh4", src / "fresh4" / "1" / "model.onnx")
    status, reply = b1.http_get("/v2/models/fresh4")
    assert status == 200 and json.loads(reply)["inputs"][0]["shape"] == [-1, 32], reply
    client = triton.InferenceServerClient(b1.grpc_url)
    assert client.is_model_ready("fresh4") and not client.is_model_ready("nowhere")
    client.close()
    assert b1.http_get("/v2/models/nowhere/ready")[0] == 404

    # Placement sees the demand at once and, while the calls go on, keeps each
    # model where it was loaded.
    def placed(site: str, name: str) -> bool:
        assert http_post(fleet.agents[site], f"/v2/models/{name}/infer", body)[0] == 200
        return name in fleet.loaded_at(site)

    wait_until(lambda: placed("a1", "fresh"), 10, what="fresh placed at a1")
    wait_until(lambda: placed("b1", "fresh2"), 10, what="fresh2 placed at b1")
    # Its load (about 0.1 s here) within one placement period (1 s), with slack
    # for a loaded machine.
    assert first_call_s < 3.0

    def explained() -> list[str]:
        return list(fleet.call("ExplainPlacement", pb.ModelName(name="fresh")).lines)  # type: ignore[attr-defined]

    wait_until(
        lambda: any(line.startswith("demand from a: observed") for line in explained()),
        10,
        what="explain shows observed and forecast demand",
    )


def http_post(
    agent: AgentProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://{agent.http_url}{path}",
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()
