"""The fleet under faults: callers at every site that never pause while the fleet's
central parts fail, one after another, and all at once.

    python bench/fleet_faults.py [--fault-s 12] [--calm-s 8] [--callers 2] [--plain]
                                 [--only broker,regional] [--json out.json] [--keep DIR]

Starts on this machine, as a fleet runs them: Redis as a primary, a replica and
three Sentinels; the control plane's broker (mosquitto); two control-plane
replicas (one leads, one stands by); three agents, two in region a and one in
region b, each given both replicas. As a fleet is deployed, the control plane's
gRPC and the brokers speak TLS, each site is its own broker user, and region b
has a broker of its own, bridged to the control plane's, which b1 uses
(`--plain`: no TLS, one anonymous broker for all). The catalog holds three small
models: `everywhere` (a replica at every site), `one` (two replicas, region a
only) and `two` (region b only), so every site serves some requests itself and
forwards others to the region that holds the model.

Every site has `--callers` closed-loop callers (tritonclient, gRPC), each asking
its own agent for the three models in turn, one call at a time, never pausing,
never retrying. The run then goes through these faults, each for `--fault-s`
seconds and followed by `--calm-s` seconds for the fleet to recover (a fault's
window runs until the next one starts):

- `runner`: the shared runner at a1 is killed (SIGKILL); the agent restarts
  it and sends again the batches it had not answered.
- `agent`: the agent at a2 is killed (SIGKILL), and started again (on new
  ports, as a new process; a2's callers follow it) at the end of the fault.
  Calls at a2 itself fail while it is gone and are counted apart; b1 forwards
  `one` to a1 or a2 and must fail none.
- `hung`: the agent at a1 is stopped (SIGSTOP) and continued at the end of
  the fault: its kernel still accepts connections and acknowledges bytes, so
  only an answer that never comes shows it hung. b1 forwards `one` to a1 first
  and must fail none; calls at a1 itself are counted apart.
- `leader`: the leading control-plane replica is killed (SIGKILL); the
  standby takes over. It is started again at the end of the fault.
- `redis`: the Redis primary is killed (SIGKILL); the Sentinels promote the
  replica. It is started again at the end of the fault (and becomes a replica).
- `broker`: the control plane's broker is killed (SIGKILL) and started again at
  the end of the fault; agents keep their last desired state and routes
  meanwhile, and region b's broker has its bridge to reconnect.
- `regional`: region b's broker is killed and started again (not with
  `--plain`): b1 alone loses its broker.
- `wiped`: as `broker`, and the broker's store is deleted before it starts
  again: it comes back without the retained desired states and routes, which
  the control plane sends again.
- `centre`: the whole centre stops answering at once (SIGSTOP: both replicas,
  Redis, the Sentinels and the broker), as when the edge loses its link to it,
  and continues (SIGCONT) at the end of the fault. The data plane must not
  notice; the control plane must not take the silence for sites gone.

The goal for every fault is no failed call: what the agents serve needs none of
the centre while it runs. For each fault it prints the calls, the failures (and
their first messages), latency percentiles, the sites a control plane marked
down ("down"), and how long a catalog change made as the fault ends takes to be
loaded at every site ("change s": a pinned model added, the add retried while
the control plane refuses it); after the last fault, whether the catalog and
sites are intact and how long one more change takes.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeplex.agent.catalog import demo  # noqa: E402
from edgeplex.control_plane.broker_files import acl_text, set_password  # noqa: E402
from edgeplex.proto import edgeplex_control_pb2 as pb  # noqa: E402
from edgeplex.rig.certs import issue  # noqa: E402
from tests.services import (  # noqa: E402
    MASTER,
    Bridge,
    ControlPlane,
    FleetBroker,
    Mosquitto,
    RedisReplica,
    RedisServer,
    Sentinel,
    Service,
    online_replicas,
    sentinel_url,
)
from tests.support.fleet import Fleet  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

SITES = (("a1", "a"), ("a2", "a"), ("b1", "b"))
# name -> (min replicas, the regions it may be placed in: elsewhere it is forwarded)
MODELS = {"everywhere": (3, ()), "one": (2, ("a",)), "two": (1, ("b",))}
X = np.ones((1, 32), np.float32)
BRIDGE = "edgeplex-bridge-b"  # region b's broker's user at the control plane's


@dataclass
class Call:
    at: float  # monotonic, when it was sent
    site: str
    model: str
    ms: float
    error: str = ""


@dataclass
class Callers:
    """Closed-loop callers, each asking its own agent for every model in turn."""

    fleet: Fleet
    per_site: int
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self, site: str, first: int) -> None:
        url = self.fleet.agents[site].grpc_url
        client = tg.InferenceServerClient(url)
        tensor = tg.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        names = list(MODELS)
        i = first
        while not self._stop.is_set():
            if self.fleet.agents[site].grpc_url != url:  # the site's agent started anew
                url = self.fleet.agents[site].grpc_url
                client = tg.InferenceServerClient(url)
            model = names[i % len(names)]
            i += 1
            started = time.monotonic()
            error = ""
            try:
                client.infer(model, [tensor], client_timeout=10)
            except InferenceServerException as exc:
                error = f"{exc.status()}: {exc.message()}"
                time.sleep(0.01)  # (a caller whose agent is gone is refused at once)
            ms = (time.monotonic() - started) * 1000
            self.calls.append(Call(started, site, model, ms, error))  # list.append: atomic

    def __enter__(self) -> Callers:
        for site, _ in SITES:
            for k in range(self.per_site):
                thread = threading.Thread(target=self._run, args=(site, k), daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)


@dataclass
class Centre:
    """The fleet's central parts: Redis with its replica and Sentinels, the broker,
    two control-plane replicas."""

    primary: RedisServer
    replica: RedisReplica
    sentinels: list[Sentinel]
    mqtt: Mosquitto
    replicas: list[ControlPlane]
    regional: FleetBroker | None = None  # region b's broker, at the edge: not the centre's

    def services(self) -> list[Service]:
        return [self.primary, self.replica, *self.sentinels, self.mqtt, *self.replicas]

    def redis_primary(self) -> RedisServer:
        """The Redis the Sentinels now call the primary."""
        port = int(redis.Redis(port=self.sentinels[0].port).sentinel_get_master_addr_by_name(
            MASTER)[1])  # fmt: skip
        return self.primary if self.primary.port == port else self.replica

    def leader(self, fleet: Fleet) -> ControlPlane:
        for cp in self.replicas:
            if cp.process is not None and cp.process.poll() is None:
                placement = fleet.call("GetPlacement", pb.PlacementRequest(), cp)
                for candidate in self.replicas:
                    if placement.leader == candidate.replica:  # type: ignore[attr-defined]
                        return candidate
        raise RuntimeError("no replica leads")


def start_centre(work: Path, plain: bool) -> Centre:
    (work / "primary").mkdir()
    (work / "replica").mkdir()
    primary = RedisServer(work / "primary")
    replica = RedisReplica(work / "replica", primary)
    sentinels = [Sentinel(work, primary) for _ in range(3)]
    for service in (primary, replica, *sentinels):
        service.start()
    probe = redis.Redis(port=sentinels[0].port)
    wait_until(
        lambda: probe.sentinel_slaves(MASTER) and len(probe.sentinel_sentinels(MASTER)) == 2,
        timeout=30, what="the Sentinels to find the replica and each other",
    )  # fmt: skip
    wait_until(lambda: online_replicas(primary.port) == 1, what="the replica in sync")
    url = sentinel_url(sentinels)
    env = {
        "EDGEPLEX_CP_REGION_LATENCY_MS": '{"a,b": 30}',
        "EDGEPLEX_CP_SITE_LEASE_S": "4",
    }
    if plain:
        mqtt = Mosquitto(work)
        mqtt.start()
        replicas = [ControlPlane(work, primary, mqtt.url(), url, **env) for _ in range(2)]
        for cp in replicas:
            cp.start()
        return Centre(primary, replica, sentinels, mqtt, replicas)
    # As a fleet is deployed: TLS on the control plane's gRPC and both brokers, a
    # broker user a site, and region b on a broker of its own, bridged to the
    # control plane's.
    tls = issue(work / "pki", "server", ["127.0.0.1"])
    central = FleetBroker(work / "broker", tls=tls)
    cp_password = set_password(central.password_file, "edgeplex-cp")
    bridge = Bridge(
        central.port, BRIDGE, set_password(central.password_file, BRIDGE), tls / "ca.pem"
    )
    central.acl_file.write_text(acl_text({}, bridges=[BRIDGE]))
    central.start()
    env |= {
        "EDGEPLEX_CP_TLS_CERT": str(tls / "cert.pem"),
        "EDGEPLEX_CP_TLS_KEY": str(tls / "key.pem"),
        "EDGEPLEX_CP_MQTT_TLS_CA": str(tls / "ca.pem"),
        "EDGEPLEX_CP_MQTT_PASSWORD_FILE": str(central.password_file),
        "EDGEPLEX_CP_MQTT_ACL_FILE": str(central.acl_file),
        "EDGEPLEX_CP_MQTT_PID_FILE": str(central.pid_file),
        "EDGEPLEX_CP_MQTT_BRIDGE_USERS": json.dumps([BRIDGE]),
    }
    mqtt_url = central.url("edgeplex-cp", cp_password)
    replicas = [
        ControlPlane(work, primary, mqtt_url, url, tls_ca=tls / "ca.pem", **env) for _ in range(2)
    ]
    for cp in replicas:
        cp.start()
    regional = FleetBroker(work / "regional", files=work / "broker", tls=tls, bridge=bridge)
    regional.start()
    return Centre(primary, replica, sentinels, central, replicas, regional)


def runner_pid(fleet: Fleet, site: str) -> int:
    _, body = fleet.agents[site].http_get("/edgeplex/v1/status")
    pids = {m["runner_pid"] for m in json.loads(body) if m.get("runner_pid")}
    if len(pids) != 1:
        raise RuntimeError(f"expected one shared runner at {site}: {pids}")
    return pids.pop()


def serves_everything(fleet: Fleet) -> bool:
    for site, _ in SITES:
        client = tg.InferenceServerClient(fleet.agents[site].grpc_url)
        tensor = tg.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        for model in MODELS:
            try:
                client.infer(model, [tensor], client_timeout=10)
            except InferenceServerException:
                return False
    return True


def sites_marked_down(centre: Centre) -> int:
    """Times a replica's log says a site's lease lapsed, so far."""
    return sum(cp.log().count("down (lease lapsed)") for cp in centre.replicas)


@contextlib.contextmanager
def stopped(services: list[Service]) -> Iterator[None]:
    """The services' processes stopped (SIGSTOP) while the block runs."""
    pids = [s.process.pid for s in services if s.process is not None]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def faults(fleet: Fleet, centre: Centre) -> list[tuple[str, Callable[[], Callable[[], None]]]]:
    """(name, start): start() breaks something and returns what ends the fault."""

    def runner() -> Callable[[], None]:
        os.kill(runner_pid(fleet, "a1"), signal.SIGKILL)
        return lambda: None

    def leader() -> Callable[[], None]:
        cp = centre.leader(fleet)
        cp.stop(signal.SIGKILL)
        return cp.start

    def redis_primary() -> Callable[[], None]:
        primary = centre.redis_primary()
        primary.stop(signal.SIGKILL)
        return primary.start  # the Sentinels make it a replica of the promoted one

    def agent() -> Callable[[], None]:
        fleet.agents["a2"].process.kill()  # SIGKILL
        fleet.agents["a2"].process.wait()

        def start_again() -> None:
            fleet.start_agent("a2", "a")  # on new ports: its callers follow

        return start_again

    def hung_agent() -> Callable[[], None]:
        pid = fleet.agents["a1"].process.pid  # the holder of `one` b1 asks first
        os.kill(pid, signal.SIGSTOP)  # its kernel still accepts connections and bytes
        return lambda: os.kill(pid, signal.SIGCONT)

    def broker() -> Callable[[], None]:
        centre.mqtt.stop(signal.SIGKILL)
        return centre.mqtt.start

    def regional_broker() -> Callable[[], None]:
        assert centre.regional is not None
        centre.regional.stop(signal.SIGKILL)
        return centre.regional.start

    def broker_wiped() -> Callable[[], None]:
        centre.mqtt.stop(signal.SIGKILL)
        (centre.mqtt.workdir / "mosquitto.db").unlink(missing_ok=True)  # its retained store
        return centre.mqtt.start

    def whole_centre() -> Callable[[], None]:
        pause = stopped(centre.services())
        pause.__enter__()
        return lambda: pause.__exit__(None, None, None)

    chosen = [
        ("runner", runner),
        ("agent", agent),
        ("hung", hung_agent),
        ("leader", leader),
        ("redis", redis_primary),
        ("broker", broker),
        ("regional", regional_broker),
        ("wiped", broker_wiped),
        ("centre", whole_centre),
    ]
    return [f for f in chosen if f[0] != "regional" or centre.regional is not None]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summary(calls: list[Call], start: float, end: float, killed: str) -> dict[str, object]:
    """The calls answered in [start, end) (a call in flight when a fault began is
    the fault's): those at the `killed` site (whose agent was killed: they have no
    server) are counted apart."""
    ended = [c for c in calls if start <= c.at + c.ms / 1000 < end]
    window = [c for c in ended if c.site != killed]
    failed = [c for c in window if c.error]
    at_killed = [c for c in ended if c.site == killed]
    first: dict[str, int] = {}
    for c in failed:
        key = f"{c.site} {c.model}: {c.error[:160]}"
        first[key] = first.get(key, 0) + 1
    ms = [c.ms for c in window if not c.error]
    return {
        "calls": len(window),
        "failed": len(failed),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms, default=float("nan")), 1),
        "errors": sorted(first.items(), key=lambda kv: -kv[1])[:5],
        "at_killed_site": f"{sum(1 for c in at_killed if c.error)}/{len(at_killed)} failed",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fault-s", type=float, default=12.0)
    parser.add_argument("--calm-s", type=float, default=8.0)
    parser.add_argument("--callers", type=int, default=2, help="per site")
    parser.add_argument("--only", default="", help="comma-separated faults to run")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="one anonymous broker and no TLS (by default the fleet runs as deployed: TLS, "
        "a broker user a site, and region b on its own broker, bridged)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="run in this new folder and keep its logs")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True)
            work = args.keep.resolve()
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edgeplex-faults-")))
        centre = start_centre(work, args.plain)
        fleet = Fleet(work, centre.primary, centre.mqtt, centre.replicas[0], centre.replicas[1])
        if centre.regional is not None:
            fleet.regional["b"] = centre.regional
        try:
            run(fleet, centre, args)
        finally:
            for agent in fleet.agents.values():
                agent.stop()
            if centre.regional is not None:
                centre.regional.stop()
            for service in reversed(centre.services()):
                with contextlib.suppress(ProcessLookupError):
                    if service.process is not None:
                        os.kill(service.process.pid, signal.SIGCONT)
                service.stop()


def run(fleet: Fleet, centre: Centre, args: argparse.Namespace) -> None:
    for i, name in enumerate(MODELS):
        demo.make_mlp(fleet.workdir / "src" / name, width=64, layers=2, in_width=32, seed=i)
        fleet.artifacts[name] = fleet.workdir / "src" / name / "1" / "model.onnx"
    for site, region in SITES:
        fleet.start_agent(site, region)
    for name, (replicas, regions) in MODELS.items():
        fleet.add_model(name, fleet.artifacts[name], min_replicas=replicas, regions=regions)
    wait_until(lambda: serves_everything(fleet), timeout=60, what="every site serving")
    chosen = [f for f in faults(fleet, centre) if not args.only or f[0] in args.only.split(",")]
    results: dict[str, dict[str, object]] = {}
    reached: dict[str, float] = {}
    with Callers(fleet, args.callers) as callers:
        time.sleep(args.calm_s)
        marks = [("calm", time.monotonic(), sites_marked_down(centre))]
        time.sleep(args.calm_s)
        for name, start in chosen:
            marks.append((name, time.monotonic(), sites_marked_down(centre)))
            end = start()
            time.sleep(args.fault_s)
            end()
            # A catalog change made as the fault ends: how long until every site has it.
            reached[name] = change_reaches_every_site(fleet, f"after-{name}")
            time.sleep(max(0.0, args.calm_s - reached[name]))
        marks.append(("end", time.monotonic(), sites_marked_down(centre)))
    for (name, began, down), (_, ended, down_after) in itertools.pairwise(marks):
        killed = {"agent": "a2", "hung": "a1"}.get(name, "")
        results[name] = summary(callers.calls, began, ended, killed)
        results[name]["sites_marked_down"] = down_after - down
        results[name]["change_everywhere_s"] = reached.get(name, float("nan"))
    # After every fault: nothing lost, and the fleet still follows the control plane.
    models = {m.name for m in fleet.call("ListModels", pb.ListModelsRequest()).models}  # type: ignore[attr-defined]
    sites = {s.site_id for s in fleet.call("ListSites", pb.ListSitesRequest()).sites}  # type: ignore[attr-defined]
    after = {
        "catalog_intact": models == set(MODELS) | {f"after-{name}" for name in reached},
        "sites_intact": sites == {s for s, _ in SITES},
        "late_model_everywhere_s": change_reaches_every_site(fleet, "late"),
    }
    report(args, results, after)


def change_reaches_every_site(fleet: Fleet, name: str) -> float:
    """Seconds from adding `name` to the catalog (pinned: every site loads it; the
    add retried while the control plane refuses it) until every site has it loaded."""
    asked = time.monotonic()
    artifact = fleet.artifacts["everywhere"]  # the same bytes, under another name
    wait_until(lambda: fleet.add_model(name, artifact, pin=True) or True, what="the catalog change")
    wait_until(lambda: loaded_everywhere(fleet, name), timeout=120, what=f"{name} everywhere")
    return round(time.monotonic() - asked, 2)


def loaded_everywhere(fleet: Fleet, name: str) -> bool:
    for site, _ in SITES:
        _, body = fleet.agents[site].http_get("/edgeplex/v1/status")
        if not any(m["name"] == name and m["tier"] == "loaded" for m in json.loads(body)):
            return False
    return True


def report(args: argparse.Namespace, results: dict[str, dict[str, object]], after: dict) -> None:  # type: ignore[type-arg]
    print(
        f"fleet_faults: 3 sites (a1, a2 in a; b1 in b), {args.callers} closed-loop gRPC "
        f"callers a site, 3 models; "
        + (
            "no TLS, one anonymous broker; "
            if args.plain
            else "TLS, a broker user a site, b1 on a bridged broker; "
        )
        + f"each fault {args.fault_s:.0f} s, then "
        f"{args.calm_s:.0f} s calm; {platform.node()} {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    head = ("calls", "failed", "p50 ms", "p99 ms", "max ms", "down", "change s")
    print(f"{'window':8} " + " ".join(f"{h:>8}" for h in head))
    for name, r in results.items():
        print(
            f"{name:8} {r['calls']:>8} {r['failed']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} "
            f"{r['max_ms']:>8} {r['sites_marked_down']:>8} {r['change_everywhere_s']:>8}"
        )
        if name in ("agent", "hung"):
            print(f"         at the agent's own site: {r['at_killed_site']}")
        for error, count in r["errors"]:  # type: ignore[attr-defined]
            print(f"         {count} x {error}")
    print(json.dumps(after))
    if args.json:
        args.json.write_text(json.dumps({"faults": results, "after": after}, indent=2))


if __name__ == "__main__":
    main()
