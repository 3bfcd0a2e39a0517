"""The control plane at fleet size: a thousand light agents against one control plane.

    python bench/fleet_scale.py [--sites 1000] [--models 10000] [--duration 30]
        [--settle 60] [--artifacts 200] [--plain] [--failover] [--json out.json]

Starts Redis, mosquitto and `edgeplex control-plane` on this machine. The
control plane manages the broker's password and ACL files, as the rig does:
`admin site add` gives each site its own broker user, which reads only its own
desired state. Then it enrols `--models` catalog models (AddModel: each
verified, sha256 and ONNX probe) and `--sites` sites (AddSite: a join token
and a broker password each).

A harness process then runs every site as its agent would, without ONNX:
Register with its join token; one Report stream, a LoadReport every 2 s with
its share of the demand (rates by region for 20 models, with their device
bytes, which placement packs by); one MQTT session as its own broker user,
subscribed to its desired-state topic. Once every site is registered and
subscribed, and `--settle` seconds later (the fleet's start-up: sites coming
up, demand building, placement filling them), for `--duration` seconds it
measures:
- ingestion: reports the control plane received a second, and the control
  plane's CPU (its own process, read from /proc: the harness's is reported
  apart);
- placement: the rounds' time (edgeplex_cp_placement_seconds: mean, and the
  bucket the slowest fell in);
- fan-out, two changes of every site's desired state, one after the other: a
  tenant added through the admin API (sent on the placement the control plane
  has: no round waited for), then a model added pinned (which a round must
  place at every site); for each, the time until each site's subscriber has
  the new state (median and the last of them);
- memory: the control plane's resident set;
- the rest of the centre: the broker's and Redis's CPU over the window.
Goals: placement round <= 2 s, a desired-state change at every
site within 5 s, 500 reports a second ingested using under one core.
Everything shares this machine's cores, harness included.

The fleet's TLS is on unless `--plain`: the control plane's gRPC and the broker
present a certificate of the run's own CA, which every agent checks.

`--failover` runs Redis as a primary, a replica and three Sentinels (the
control plane waits for the replica on the writes that must survive, Redis's
WAIT) and kills the primary (SIGKILL) 3 s into the window, then restarts it as
its service manager would. Meanwhile writers add sites, usage minutes and batch
jobs, each call retried until acknowledged; the run reports how fast the
replica was promoted, the longest gap between placement rounds, how many
rounds that gap missed, how soon after the promotion a round ended, and how many
acknowledged writes the new primary lacks (goal: none). The Sentinels'
`--down-after-ms` (1000 by default; docs/deployment.md advises 5000) and the
placement interval (`--placement-interval`, 2 s by default; 10 s or more for a
fleet this size) set what one round is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import cpu_seconds, free_port, rss_bytes  # noqa: E402

from edgeplex.fleet import MQTT_KEEPALIVE_S  # noqa: E402
from edgeplex.proto import edgeplex_control_pb2 as pb  # noqa: E402
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc  # noqa: E402
from tests.services import (  # noqa: E402
    MASTER,
    TOKEN,
    ControlPlane,
    FleetBroker,
    RedisReplica,
    RedisServer,
    Sentinel,
    online_replicas,
    sentinel_url,
    usage_minutes_on,
)

AUTH = (("authorization", f"Bearer {TOKEN}"),)
REGIONS = ("us-west", "us-east", "eu", "asia", "oceania")
PROBE_TENANT = "scale-probe"  # a tenant added: every site's state anew, nothing placed
PROBE_MODEL = "pinned-probe"  # a model pinned: placed at every site


def grpc_credentials(ca: str | None):  # type: ignore[no-untyped-def]
    """The channel credentials agents use: the fleet's CA, or none (--plain)."""
    import grpc

    return grpc.ssl_channel_credentials(Path(ca).read_bytes()) if ca else None


def admin_channel(address: str, ca: str | None):  # type: ignore[no-untyped-def]
    import grpc

    creds = grpc_credentials(ca)
    return grpc.secure_channel(address, creds) if creds else grpc.insecure_channel(address)


def metrics(http_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def phases(text: str) -> dict[str, float]:
    found = re.findall(r'^edgeplex_cp_placement_phase_seconds_total\{phase="([^"]+)"\} (\S+)$',
                       text, re.M)  # fmt: skip
    return {phase: float(n) for phase, n in found}


def buckets(text: str) -> dict[str, float]:
    found = re.findall(r'^edgeplex_cp_placement_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)
    return {le: float(n) for le, n in found}


def model_bytes(name: str) -> int:
    """A model's device bytes, log-uniform from 10 MB to 2 GB by its name's hash."""
    u = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return int(10e6 * (200.0**u))


# --- the harness: every site as its agent runs, without ONNX ---------------------------


async def harness(address: str, mqtt_port: int, sites: list[dict], models: int,
                  duration: float, settle: float, ca: str | None,
                  probe_artifact: tuple[str, str]) -> dict:  # fmt: skip
    import ssl

    import aiomqtt
    import grpc

    tls = {"tls_context": ssl.create_default_context(cafile=ca)} if ca else {}

    started = time.monotonic()
    # Per probe (its marker in a desired state's bytes): when each site had it.
    arrivals: dict[bytes, dict[str, float]] = {}
    connected = sent = 0
    failures: list[str] = []  # calls that failed while the harness ran
    sizes: list[int] = []  # of the desired-state messages received
    inflated: list[int] = []  # ...and of their payloads, inflated
    distinct: list[int] = []  # ...deflated as if each model had its own artifact
    last_seen: dict[str, tuple[int, float]] = {}  # site -> the highest version, its arrival
    stop = asyncio.Event()

    async def subscriber(site: dict) -> None:
        """Subscribed until stopped; a lost or refused connection is counted and
        tried again a second later, as an agent's link does."""
        nonlocal connected
        topic = f"edgeplex/v1/sites/{site['site_id']}/desired"
        counted = False
        while not stop.is_set():
            client = aiomqtt.Client(
                "127.0.0.1", mqtt_port, identifier=site["site_id"], username=site["site_id"],
                password=site["mqtt_password"], keepalive=MQTT_KEEPALIVE_S, **tls,
            )  # fmt: skip
            try:
                async with client:
                    await client.subscribe(topic, qos=1)
                    connected += not counted
                    counted = True
                    async for message in client.messages:
                        received(site, bytes(message.payload))  # type: ignore[arg-type]
                        if stop.is_set():
                            return
            except aiomqtt.MqttError as exc:
                failures.append(f"MQTT: {exc}")
                await asyncio.sleep(1.0)

    def received(site: dict, payload: bytes) -> None:
        sizes.append(len(payload))
        body = pb.SignedBody.FromString(pb.SignedMessage.FromString(payload).body)
        payload = zlib.decompress(body.payload) if body.encoding else body.payload
        inflated.append(len(payload))
        if len(sizes) % 20 == 0:  # a sample across the run
            distinct.append(len(zlib.compress(every_model_its_own(payload), 6)))
        if body.version > last_seen.get(site["site_id"], (0, 0.0))[0]:  # as an agent applies
            last_seen[site["site_id"]] = (body.version, time.monotonic())
        for marker, seen in arrivals.items():
            if site["site_id"] not in seen and marker in payload:
                seen[site["site_id"]] = time.monotonic()

    async def agent(site: dict, stub: pb_grpc.AgentServiceStub, index: int) -> None:
        """Register and report until stopped; a failed call is counted and tried
        again a second later, as an agent's link does."""
        while not stop.is_set():
            try:
                await session(site, stub, index)
            except grpc.aio.AioRpcError as exc:
                if not stop.is_set():
                    failures.append(f"{exc.code().name}: {exc.details()}")
                    await asyncio.sleep(1.0)

    async def session(site: dict, stub: pb_grpc.AgentServiceStub, index: int) -> None:
        metadata = (("authorization", f"Bearer {site['join_token']}"),)
        await stub.Register(
            pb.RegisterRequest(
                site_id=site["site_id"], region=site["region"],
                address=f"127.0.0.1:{20000 + index}", http_address=f"127.0.0.1:{40000 + index}",
                budgets=pb.TierBudgets(device_bytes=24 << 30, host_bytes=128 << 30),
                devices=[pb.Device(kind="cuda", index=0, memory_bytes=24 << 30)],
            ),
            metadata=metadata, timeout=30,
        )  # fmt: skip
        # Its share of the demand: 20 models, Zipf-like over the catalog, by region.
        picks = [(index * 7919 + k * k * 104729) % models for k in range(20)]
        loads = [
            pb.ModelLoad(
                name=f"m{j}", version="1", tier="loaded", state="READY",
                memory_bytes=model_bytes(f"m{j}"),
                rate_by_region={site["region"]: 50.0 / (1 + k)},
            )
            for k, j in enumerate(picks)
        ]  # fmt: skip

        async def reports():  # type: ignore[no-untyped-def]
            nonlocal sent
            # Every 2 s on the clock (a late report does not push the next ones back),
            # the fleet's reports spread out over the interval.
            due = time.monotonic() + (index % 100) / 50.0
            while not stop.is_set():
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due += 2.0
                device = pb.DeviceLoad(index=0, budget_bytes=24 << 30)
                yield pb.LoadReport(
                    site_id=site["site_id"], sent_at=time.time(), models=loads, devices=[device],
                    desired_version=last_seen.get(site["site_id"], (0, 0.0))[0],
                )  # fmt: skip
                sent += 1

        await stub.Report(reports(), metadata=metadata)

    creds = grpc_credentials(ca)
    channels = [
        grpc.aio.secure_channel(address, creds) if creds else grpc.aio.insecure_channel(address)
        for _ in range(8)
    ]
    stubs = [pb_grpc.AgentServiceStub(c) for c in channels]
    subscribers = []
    for i, site in enumerate(sites):  # connect in small groups: a thousand at once is a flood
        subscribers.append(asyncio.create_task(subscriber(site)))
        if i % 50 == 49:
            await asyncio.sleep(0.2)
    agents = [asyncio.create_task(agent(s, stubs[i % len(stubs)], i)) for i, s in enumerate(sites)]
    while connected < len(sites) and time.monotonic() - started < 300:
        await asyncio.sleep(0.5)
    ready_s = time.monotonic() - started
    print(json.dumps({"event": "ready", "connected": connected, "ready_s": ready_s}), flush=True)

    async def probe(marker: bytes, ask: Callable[[], object]) -> dict:
        """Make a change (`ask`, retried while Redis fails over) whose states carry
        `marker`; when each site had it, counted from when it was asked."""
        first: float | None = None
        seen = arrivals[marker] = {}
        while True:
            began = time.monotonic()
            first = first or began
            try:
                ask()
                break
            except grpc.RpcError as exc:
                # Redis failing over (--failover): refused, try again. A refused write
                # may have been made (no replica acknowledged it in time): then the
                # retry finds it, and the change went out with the first try.
                if exc.code() == grpc.StatusCode.ALREADY_EXISTS and first < began:
                    began = first
                    break
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(0.5)
        while len(seen) < len(sites) and time.monotonic() < began + 60:
            await asyncio.sleep(0.05)
        times = sorted(t - began for t in seen.values())

        def missed(site_id: str) -> tuple[str, int | None, float | None]:
            if site_id not in last_seen:
                return site_id, None, None
            version, at = last_seen[site_id]
            return site_id, version, round(at - began, 2)

        return {
            "reached": len(times),
            "p50_s": times[len(times) // 2] if times else None,
            "last_s": times[-1] if times else None,
            # Sites it never reached: the version of the last state each was sent, and
            # when it came (seconds after the change was made).
            "missed": [missed(s["site_id"]) for s in sites if s["site_id"] not in seen][:10],
        }

    await asyncio.sleep(settle)
    print(json.dumps({"event": "settled"}), flush=True)
    started = time.monotonic()
    sent0, sent_t0 = sent, time.monotonic()
    await asyncio.sleep(duration / 2)
    cpu0 = time.process_time()
    with admin_channel(address, ca) as opened:  # the changes that reach every site
        admin = pb_grpc.AdminServiceStub(opened)
        tenant = await probe(
            PROBE_TENANT.encode(),
            lambda: admin.AddTenant(pb.TenantSpec(name=PROBE_TENANT), metadata=AUTH, timeout=10),
        )
        uri, sha256 = probe_artifact
        model = pb.CatalogModel(name=PROBE_MODEL, artifact_uri=uri, sha256=sha256, pin=True)
        pinned = await probe(
            PROBE_MODEL.encode(), lambda: admin.AddModel(model, metadata=AUTH, timeout=10)
        )
    await asyncio.sleep(max(0.0, started + duration - time.monotonic()))
    harness_cpu = time.process_time() - cpu0
    sent_per_s = (sent - sent0) / (time.monotonic() - sent_t0)
    stop.set()
    for task in subscribers:
        task.cancel()
    await asyncio.wait(agents, timeout=5)  # the streams end with their next report
    for open_channel in channels:
        await open_channel.close()
    return {
        "event": "done",
        "connected": connected,
        "reports_sent": sent,
        "reports_sent_per_s": sent_per_s,
        "failed_calls": len(failures),
        "desired_messages": len(sizes),
        "desired_mean_bytes": sum(sizes) / len(sizes) if sizes else 0,
        "desired_mean_inflated_bytes": sum(inflated) / len(inflated) if inflated else 0,
        "desired_mean_distinct_deflated_bytes": sum(distinct) / len(distinct) if distinct else 0,
        "failures_seen": sorted(set(failures))[:5],
        "fanout": {"tenant": tenant, "pinned_model": pinned},
        "harness_cpu_s_second_half": harness_cpu,
    }


def every_model_its_own(payload: bytes) -> bytes:
    """A desired state as it would be if each model had its own artifact (URI and
    sha256): what a real catalog sends, and deflates less well than the bench's."""
    state = pb.DesiredState.FromString(payload)
    for model in state.models:
        model.artifact_uri = f"https://artifacts.example.com/{model.name}/{model.version}/m.onnx"
        model.sha256 = hashlib.sha256(model.artifact_uri.encode()).hexdigest()
    return state.SerializeToString()


def run_harness(argv: list[str]) -> None:
    config = json.loads(Path(argv[0]).read_text())
    result = asyncio.run(harness(**config))
    print(json.dumps(result), flush=True)


class RoundWatch:
    """Each placement round's time, phases and end, from the control plane's log
    (its line "round N: T s (read R, place P, publish U); C of S sites' desired
    states changed"), read every 0.1 s. It
    used to read /metrics ten times a second: exporting a thousand sites' series
    each time took an eighth of the control plane's CPU, work the harness put on
    the process it measures."""

    LINE = re.compile(
        rb"round \d+: ([\d.]+) s \(read ([\d.]+), place ([\d.]+), publish ([\d.]+)\)(?:; (\d+) of)?"
    )

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.start = log_path.stat().st_size  # the rounds from now on
        self.ends: list[float] = []
        self.times: list[float] = []
        self.phases: list[dict[str, float]] = []  # each round's read, place, publish
        self.changed: list[int] = []  # each round's sites whose desired state changed
        self.stepped_down = 0  # times the leader's lease lapsed (under its own load)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.log_path.open("rb") as log:
            log.seek(self.start)
            partial = b""
            while not self.stop.is_set():
                *lines, partial = (partial + log.read()).split(b"\n")
                seen = time.monotonic()
                for line in lines:
                    self.stepped_down += b" is a standby" in line
                    found = self.LINE.search(line)
                    if found is not None:
                        took, read, place, publish = map(float, found.groups()[:4])
                        self.times.append(took)
                        if found.group(5) is not None:
                            self.changed.append(int(found.group(5)))
                        self.phases.append({"read": read, "place": place, "publish": publish})
                        self.ends.append(seen)
                time.sleep(0.1)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)


# --- the Redis failover (--failover) ----------------------------------------------------


class Failover:
    """The primary killed mid-window (SIGKILL) under the fleet's load, and restarted
    as its service manager would (the Sentinels make it the new primary's replica).
    Meanwhile three writers call verbs whose writes must survive (AddSite, ReportUsage,
    SubmitBatch), each call retried until acknowledged; afterwards every acknowledged
    write must be on the new primary."""

    def __init__(self, address: str, ca: str | None, site: dict) -> None:
        self.address, self.ca, self.site = address, ca, site
        self.acked: dict[str, list[str]] = {"sites": [], "usage": [], "batch": []}
        self.refused = dict.fromkeys(self.acked, 0)
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._write, args=(what,), daemon=True) for what in self.acked
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _write(self, what: str) -> None:
        import grpc

        with admin_channel(self.address, self.ca) as opened:
            admin, agents = pb_grpc.AdminServiceStub(opened), pb_grpc.AgentServiceStub(opened)
            site = (("authorization", f"Bearer {self.site['join_token']}"),)
            i = 0
            now_minute = int(time.time() // 60)  # recent minutes: old ones are dropped
            while not self.stop.is_set():
                try:
                    if what == "sites":
                        admin.AddSite(pb.AddSiteRequest(site_id=f"failover-{i}", region="eu"),
                                      metadata=AUTH, timeout=10)  # fmt: skip
                        self.acked[what].append(f"failover-{i}")
                    elif what == "usage":
                        record = pb.UsageRecord(tenant="acme", model="m0", version="1", requests=1)
                        agents.ReportUsage(
                            pb.UsageReport(site_id=self.site["site_id"], minute=now_minute + i,
                                           interval_s=60, records=[record]),
                            metadata=site, timeout=10,
                        )  # fmt: skip
                        self.acked[what].append(f"{self.site['site_id']}/{now_minute + i}")
                    else:
                        job = admin.SubmitBatch(
                            pb.BatchSubmit(model="m0", inputs=['{"inputs": []}']),
                            metadata=AUTH, timeout=10,
                        )  # fmt: skip
                        self.acked[what].append(job.job_id)
                    i += 1
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.DEADLINE_EXCEEDED):  # fmt: skip
                        raise
                    self.refused[what] += 1
                    time.sleep(0.05)
                # A site added is a broker user added: the broker reloads its files.
                time.sleep(1.0 if what == "sites" else 0.1)

    def lost(self, redis_port: int) -> dict[str, int]:
        """Acknowledged writes missing from the Redis on `redis_port`."""
        import redis

        found = redis.Redis(port=redis_port)
        present = {
            "sites": {k.decode() for k in found.hkeys("edgeplex:join_tokens")},
            "usage": usage_minutes_on(redis_port),
            "batch": {k.decode() for k in found.hkeys("edgeplex:batch:jobs")},
        }
        return {what: len(set(self.acked[what]) - present[what]) for what in self.acked}


def redis_ha(work: Path, down_after_ms: int) -> tuple[RedisServer, RedisReplica, list[Sentinel]]:
    """A primary, its replica and three Sentinels (a primary silent for
    `down_after_ms` is down), started and in sync."""
    import redis

    (work / "primary").mkdir()
    (work / "replica").mkdir()
    primary = RedisServer(work / "primary")
    replica = RedisReplica(work / "replica", primary)
    sentinels = [Sentinel(work, primary, down_after_ms) for _ in range(3)]
    for service in (primary, replica, *sentinels):
        service.start()
    probe = redis.Redis(port=sentinels[0].port)
    deadline = time.monotonic() + 60
    while not (probe.sentinel_slaves(MASTER) and probe.sentinel_sentinels(MASTER)
               and online_replicas(primary.port) == 1):  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError("the Sentinels did not find the replica and each other")
        time.sleep(0.2)
    return primary, replica, sentinels


def fail_over(primary: RedisServer, sentinels: list[Sentinel]) -> float:
    """SIGKILL the primary, wait for the Sentinels to promote another, restart the old
    primary (it rejoins as a replica); the seconds to promotion. Under load the
    Sentinels may fail over again (a primary busy past down-after-milliseconds):
    this returns once whichever server they name has a replica in sync."""
    import redis

    killed = time.monotonic()
    primary.stop(signal.SIGKILL)
    while current_primary(sentinels) == primary.port:
        if time.monotonic() - killed > 60:
            raise RuntimeError("the Sentinels did not promote the replica")
        time.sleep(0.05)
    promoted = time.monotonic() - killed
    primary.start()
    while True:
        with contextlib.suppress(redis.RedisError):
            if online_replicas(current_primary(sentinels)) == 1:
                return promoted
        if time.monotonic() - killed > 180:
            raise RuntimeError("no primary with a replica in sync after the failover")
        time.sleep(0.2)


def current_primary(sentinels: list[Sentinel]) -> int:
    """The port of the primary the Sentinels name now."""
    import redis

    return int(redis.Redis(port=sentinels[0].port).sentinel_get_master_addr_by_name(MASTER)[1])


# --- the run ---------------------------------------------------------------------------


def artifacts(base: Path, directory: Path, n: int) -> list[tuple[str, str]]:
    """`n` distinct copies of the ONNX model `base` (each its own metadata, so its own
    bytes and sha256): (URI, sha256) of each, which the catalog's models take in
    turn. The control plane verifies each (an ONNX probe in a process of its own,
    about a second here), so `n` stays far below a real catalog's count; the
    harness also reports the size a desired state would deflate to if every model
    had its own artifact."""
    import onnx

    model = onnx.load(str(base))
    directory.mkdir(parents=True)
    made = []
    for j in range(n):
        del model.metadata_props[:]
        model.metadata_props.add(key="edgeplex-bench-copy", value=str(j))
        data = model.SerializeToString()
        path = directory / f"m{j}.onnx"
        path.write_bytes(data)
        made.append((path.as_uri(), hashlib.sha256(data).hexdigest()))
    return made


def enrol(
    address: str, n_sites: int, n_models: int, artifact: Path, n_artifacts: int, ca: str | None
) -> tuple[list[dict], tuple[str, str]]:
    """Every site and model added; the sites, and an artifact (URI, sha256) verified."""
    began = time.monotonic()
    made = artifacts(artifact, artifact.parent.parent.parent / "artifacts", n_artifacts)
    with admin_channel(address, ca) as opened:
        admin = pb_grpc.AdminServiceStub(opened)
        sites = []
        for i in range(n_sites):
            region = REGIONS[i % len(REGIONS)]
            reply = admin.AddSite(pb.AddSiteRequest(site_id=f"site-{i:04d}", region=region),
                                  metadata=AUTH, timeout=60)  # fmt: skip
            sites.append({
                "site_id": reply.site_id, "region": region,
                "join_token": reply.join_token, "mqtt_password": reply.mqtt_password,
            })  # fmt: skip
        print(f"  {n_sites} sites added: {time.monotonic() - began:.1f} s", flush=True)
        for first in range(0, n_models, 50):  # 50 calls in flight
            calls = [
                admin.AddModel.future(
                    pb.CatalogModel(
                        name=f"m{j}",
                        artifact_uri=made[j % n_artifacts][0],
                        sha256=made[j % n_artifacts][1],
                    ),
                    metadata=AUTH,
                    timeout=60,
                )
                for j in range(first, min(n_models, first + 50))
            ]
            for call in calls:
                call.result()
        print(f"  {n_models} models added: {time.monotonic() - began:.1f} s", flush=True)
        while True:  # every model verified before the clock starts
            listed = admin.ListModels(pb.ListModelsRequest(), metadata=AUTH, timeout=60).models
            if all(m.state != "PENDING" for m in listed):
                return sites, made[0]
            time.sleep(1.0)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_harness":
        run_harness(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=1000)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument(
        "--settle", type=float, default=60.0,
        help="seconds between every site reporting and the window (the fleet's start-up "
        "transient: sites coming up, placement filling them)",
    )  # fmt: skip
    parser.add_argument(
        "--artifacts", type=int, default=200, help="distinct artifacts the models take in turn"
    )
    parser.add_argument(
        "--plain", action="store_true",
        help="no TLS (the fleet runs gRPC and MQTT over TLS, which the harness does by default)",
    )  # fmt: skip
    parser.add_argument(
        "--failover", action="store_true",
        help="Redis as a primary, a replica and three Sentinels; the primary is killed "
        "a few seconds into the window, with writers of data that must survive",
    )  # fmt: skip
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's folder (logs, Redis data; the control plane logs at INFO)",
    )
    parser.add_argument(
        "--placement-interval", type=float, default=2.0,
        help="the control plane's placement_interval_s (the rounds a failover may miss)",
    )  # fmt: skip
    parser.add_argument(
        "--down-after-ms", type=int, default=1000,
        help="--failover: the Sentinels' down-after-milliseconds",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--py-spy", type=Path, help="record the control plane with py-spy over the window"
    )
    args = parser.parse_args()
    from edgeplex.agent.catalog import demo
    from edgeplex.control_plane.broker_files import acl_text, set_password
    from edgeplex.rig.certs import issue

    work = Path(tempfile.mkdtemp(prefix="edgeplex-fleet-scale-"))
    demo.make_mlp(work / "src" / "tiny", width=8, layers=1, in_width=8)
    artifact = work / "src" / "tiny" / "1" / "model.onnx"
    # The fleet's TLS: one CA; the control plane's gRPC and the broker present a
    # certificate for 127.0.0.1 that agents check (they prove who they are with their
    # join token and broker password).
    server_tls = None if args.plain else issue(work / "pki", "server", ["127.0.0.1"])
    ca = None if server_tls is None else str(server_tls / "ca.pem")
    tls_env = {} if server_tls is None else {
        "EDGEPLEX_CP_TLS_CERT": str(server_tls / "cert.pem"),
        "EDGEPLEX_CP_TLS_KEY": str(server_tls / "key.pem"),
        "EDGEPLEX_CP_MQTT_TLS_CA": str(server_tls / "ca.pem"),
    }  # fmt: skip
    mqtt = FleetBroker(work, tls=server_tls)
    if args.failover:
        redis, replica, sentinels = redis_ha(work, args.down_after_ms)
        redis_url = sentinel_url(sentinels)
    else:
        redis, replica, sentinels, redis_url = RedisServer(work), None, [], None
        redis.start()
    cp_password = set_password(mqtt.password_file, "edgeplex-cp")
    mqtt.acl_file.write_text(acl_text({}))  # the control plane's user; sites as they join
    mqtt.start()
    http_port = free_port()
    cp = ControlPlane(
        work, redis, mqtt.url("edgeplex-cp", cp_password), redis_url,
        EDGEPLEX_CP_HTTP_PORT=str(http_port),
        EDGEPLEX_CP_PLACEMENT_INTERVAL_S=str(args.placement_interval),
        EDGEPLEX_CP_REPORT_INTERVAL_S="2",
        EDGEPLEX_CP_SITE_LEASE_S="20",
        EDGEPLEX_CP_DEMAND_HALF_LIFE_S="60",
        # INFO: each round's line, which RoundWatch reads (and, for a kept run, the
        # lease's changes: a resumed or a new term).
        EDGEPLEX_CP_LOG_LEVEL="INFO",
        EDGEPLEX_CP_MQTT_PASSWORD_FILE=str(mqtt.password_file),
        EDGEPLEX_CP_MQTT_ACL_FILE=str(mqtt.acl_file),
        EDGEPLEX_CP_MQTT_PID_FILE=str(mqtt.pid_file),
        **tls_env,
    )  # fmt: skip
    cp.start()
    report: dict[str, object] = {
        "command": "python bench/fleet_scale.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}",
    }
    harness_proc = failover = None
    try:
        assert cp.process is not None
        began = time.monotonic()
        sites, probe_artifact = enrol(
            cp.address, args.sites, args.models, artifact, args.artifacts, ca
        )
        report["enrol_s"] = time.monotonic() - began
        print(f"enrolled {args.models} models and {args.sites} sites in {report['enrol_s']:.0f} s",
              flush=True)  # fmt: skip
        config = work / "harness.json"
        config.write_text(json.dumps({"address": cp.address, "mqtt_port": mqtt.port,
                                      "sites": sites, "models": args.models,
                                      "duration": args.duration,
                                      "settle": args.settle, "ca": ca,
                                      "probe_artifact": probe_artifact}))  # fmt: skip
        harness_proc = subprocess.Popen(
            [sys.executable, __file__, "_harness", str(config)], stdout=subprocess.PIPE, text=True
        )
        assert harness_proc.stdout is not None
        ready = json.loads(harness_proc.stdout.readline())
        print(f"harness: {ready['connected']} sites subscribed and reporting after "
              f"{ready['ready_s']:.0f} s", flush=True)  # fmt: skip
        json.loads(harness_proc.stdout.readline())  # settled: the window starts
        before, cpu0, t0 = metrics(http_port), cpu_seconds(cp.process.pid), time.monotonic()
        others = {"broker": mqtt.process, "redis": redis.process}  # the centre's other parts
        others_cpu0 = {k: cpu_seconds(p.pid) for k, p in others.items() if p is not None}
        rounds_seen = RoundWatch(cp.log_path)
        spy = None
        if args.py_spy:
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "-p",
                 str(cp.process.pid), "-d", str(int(args.duration)), "-f", "raw",
                 "-o", str(args.py_spy), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        if replica is not None:
            failover = Failover(cp.address, ca, sites[0])
            failover.start()
            time.sleep(3.0)
            killed_at = time.monotonic()
            report["redis_promoted_s"] = fail_over(redis, sentinels)
        done = json.loads(harness_proc.stdout.readline())
        rounds_seen.finish()
        if failover is not None:
            failover.stop.set()
            for thread in failover.threads:
                thread.join(30)
            around = [t for t in rounds_seen.ends if t < killed_at][-1:] + [
                t for t in rounds_seen.ends if t >= killed_at
            ]
            report["placement_gap_s"] = max(b - a for a, b in itertools.pairwise(around))
            before_kill = [t for t in rounds_seen.ends if t < killed_at]
            spacing = statistics.median(
                [b - a for a, b in itertools.pairwise(before_kill)] or [args.placement_interval]
            )
            report["round_spacing_s"] = spacing
            # Rounds that should have ended in the longest gap and did not.
            report["rounds_missed"] = max(0, round(report["placement_gap_s"] / spacing) - 1)
            promoted_at = killed_at + report["redis_promoted_s"]
            after = [t for t in rounds_seen.ends if t >= promoted_at]
            report["round_after_promotion_s"] = after[0] - promoted_at if after else None
            report["sentinel_failovers"] = sum(
                "+switch-master" in line
                for line in sentinels[0].log_path.read_text(errors="replace").splitlines()
            )
            report["failover_acked"] = {k: len(v) for k, v in failover.acked.items()}
            report["failover_refused"] = failover.refused
            report["failover_lost"] = failover.lost(current_primary(sentinels))
        if spy is not None:
            spy.wait()
        after, cpu1, t1 = metrics(http_port), cpu_seconds(cp.process.pid), time.monotonic()
        # Redis's primary may have changed (--failover): its CPU is the first one's.
        others_cpu = {
            k: cpu_seconds(others[k].pid) - v  # type: ignore[union-attr]
            for k, v in others_cpu0.items()
            if others[k] is not None and others[k].poll() is None  # type: ignore[union-attr]
        }
        rss = rss_bytes(cp.process.pid)
    finally:
        if harness_proc is not None and harness_proc.poll() is None:
            harness_proc.kill()
        cp.stop()
        mqtt.stop()
        for service in (*sentinels, *([replica] if replica else []), redis):
            service.stop()
    window = t1 - t0
    total = "edgeplex_cp_reports_total"
    reports = sample(after, total) - sample(before, total)
    rounds = sample(after, "edgeplex_cp_placement_seconds_count") - sample(
        before, "edgeplex_cp_placement_seconds_count"
    )
    spent = sample(after, "edgeplex_cp_placement_seconds_sum") - sample(
        before, "edgeplex_cp_placement_seconds_sum"
    )
    b0, b1 = buckets(before), buckets(after)
    p0, p1 = phases(before), phases(after)
    phase_means = {k: (p1[k] - p0.get(k, 0.0)) / rounds for k in p1} if rounds else {}
    slowest = next((le for le in b1 if b1[le] - b0.get(le, 0.0) >= rounds), "+Inf")
    over_2s = rounds - (b1.get("2.0", 0.0) - b0.get("2.0", 0.0))
    report.update({
        "sites": args.sites, "models": args.models, "window_s": window,
        "reports_per_s": reports / window, "reports_sent_per_s": done["reports_sent_per_s"],
        "cp_cpu_cores": (cpu1 - cpu0) / window,
        "broker_cpu_cores": others_cpu.get("broker", float("nan")) / window,
        "redis_cpu_cores": others_cpu.get("redis", float("nan")) / window,
        "placement_rounds": rounds, "placement_mean_s": spent / rounds if rounds else None,
        "placement_slowest_le_s": slowest, "placement_rounds_over_2s": over_2s,
        "placement_round_s": rounds_seen.times,
        "placement_round_phases_s": rounds_seen.phases,
        "placement_round_sites_changed": rounds_seen.changed,
        "leader_stepped_down": rounds_seen.stepped_down,
        "placement_phase_mean_s": phase_means, "tls": not args.plain,
        "cp_rss_bytes": rss,
        "failed_calls": done["failed_calls"], "failures_seen": done["failures_seen"],
        "desired_messages": done["desired_messages"],
        "desired_mean_bytes": done["desired_mean_bytes"],
        "desired_mean_inflated_bytes": done["desired_mean_inflated_bytes"],
        "desired_mean_distinct_deflated_bytes": done["desired_mean_distinct_deflated_bytes"],
        "fanout": done["fanout"],
        "harness_cpu_cores": done["harness_cpu_s_second_half"] / (args.duration / 2),
    })  # fmt: skip
    print(f"# {report['command']} on {report['machine']}; gRPC and MQTT "
          + ("in clear text" if args.plain else "over TLS"))  # fmt: skip
    print(f"ingestion  {report['reports_per_s']:.0f} reports/s of "
          f"{done['reports_sent_per_s']:.0f}/s sent, control plane "
          f"{report['cp_cpu_cores']:.2f} cores (goal: 500/s under 1 core)")  # fmt: skip
    mean = report["placement_mean_s"]
    print(f"placement  {rounds:.0f} rounds, mean {mean if mean is None else f'{mean:.2f}'} s, "
          f"slowest {max(rounds_seen.times, default=0):.2f} s, {over_2s:.0f} over 2 s "
          "(goal: <= 2 s); "
          + ", ".join(f"{k} {v:.2f} s" for k, v in phase_means.items()))  # fmt: skip
    if rounds_seen.times:
        worst = max(range(len(rounds_seen.times)), key=rounds_seen.times.__getitem__)
        split = rounds_seen.phases[worst].items()
        print("           the slowest round: " + ", ".join(f"{k} {v:.2f} s" for k, v in split))
        print(f"           sites whose desired state a round changed: {rounds_seen.changed}")
    if rounds_seen.stepped_down:
        print(f"           the leader's lease lapsed {rounds_seen.stepped_down} time(s) under "
              "its load (its term resumed or not: the control plane's log)")  # fmt: skip
    for what, probe in (("a tenant added", done["fanout"]["tenant"]),
                        ("a model pinned", done["fanout"]["pinned_model"])):  # fmt: skip
        p50, last = (
            f"{v:.2f}" if v is not None else "-" for v in (probe["p50_s"], probe["last_s"])
        )
        print(f"fan-out    {what} reached {probe['reached']}/{args.sites} sites: median {p50} s, "
              f"last {last} s (goal: 5 s)")  # fmt: skip
        if probe["missed"]:
            print(f"           not reached (site, last version sent, when): {probe['missed']}")
    print(f"messages   {done['desired_messages']} desired states received, "
          f"{done['desired_mean_bytes'] / 1024:.1f} KiB each on average as sent "
          f"({done['desired_mean_inflated_bytes'] / 1024:.1f} KiB inflated; "
          f"{done['desired_mean_distinct_deflated_bytes'] / 1024:.1f} KiB deflated if every "
          "model had its own artifact)")  # fmt: skip
    print(f"failures   {done['failed_calls']} agent calls failed (tried again after 1 s): "
          f"{done['failures_seen']}")  # fmt: skip
    print(f"memory     control plane {rss / 2**20:.0f} MiB resident; harness "
          f"{report['harness_cpu_cores']:.2f} cores")  # fmt: skip
    print(f"the centre broker {report['broker_cpu_cores']:.2f} cores, Redis "
          f"{report['redis_cpu_cores']:.2f} cores over the window")  # fmt: skip
    if replica is not None:
        after = report["round_after_promotion_s"]
        print(f"failover   primary killed {3.0:.0f} s into the window (Sentinels: down after "
              f"{args.down_after_ms} ms): replica promoted in {report['redis_promoted_s']:.2f} s "
              f"({report['sentinel_failovers']} failover(s)); longest gap between placement "
              f"rounds {report['placement_gap_s']:.2f} s, rounds every "
              f"{report['round_spacing_s']:.2f} s before: {report['rounds_missed']} missed "
              "(goal: at most one); first round after the promotion ended "
              + ("never" if after is None else f"{after:.2f} s after it"))  # fmt: skip
        print(f"           writes acknowledged {report['failover_acked']}, refused and retried "
              f"{report['failover_refused']}, lost {report['failover_lost']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.keep:
        print(f"kept: {work}")
    else:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
