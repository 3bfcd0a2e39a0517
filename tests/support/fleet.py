"""A fleet for tests: Redis, mosquitto, a control plane and agents, the admin calls
made on it, and waiting for it to settle."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from edgeplex.artifacts import sha256_of
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.conftest import AgentProcess, start_agent
from tests.services import TOKEN, ControlPlane, FleetBroker, Mosquitto, RedisServer, fleet_env
from tests.support.waiting import wait_until

AUTH = [("authorization", f"Bearer {TOKEN}")]


def loaded_sets(placement: pb.Placement) -> dict[str, set[str]]:
    return {s.site_id: set(s.loaded) for s in placement.sites}  # type: ignore[attr-defined]


@dataclass
class Fleet:
    workdir: Path
    redis: RedisServer
    mqtt: Mosquitto
    cp: ControlPlane
    standby: ControlPlane | None = None
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    # A region's own broker, bridged to `mqtt`, which its sites use instead.
    regional: dict[str, FleetBroker] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)

    def admin(self, cp: ControlPlane | None = None) -> pb_grpc.AdminServiceStub:
        return pb_grpc.AdminServiceStub((cp or self.cp).channel())

    def call(self, method: str, request: object, cp: ControlPlane | None = None) -> object:
        return getattr(self.admin(cp), method)(request, metadata=AUTH, timeout=10)

    def add_model(self, name: str, path: Path, sha: str | None = None, **kw: object) -> None:
        self.call(
            "AddModel",
            pb.CatalogModel(
                name=name, artifact_uri=path.as_uri(), sha256=sha or sha256_of(path), **kw
            ),
        )

    def model(self, name: str) -> pb.ModelDetail:
        return self.call("GetModel", pb.ModelName(name=name))  # type: ignore[return-value]

    def placement(self) -> pb.Placement:
        return self.call("GetPlacement", pb.PlacementRequest())  # type: ignore[return-value]

    def journals_sent(self, *sites: str) -> bool:
        """Whether every minute in the sites' usage journals was acknowledged by the
        control plane (and removed): none of them can be sent again."""
        return not [path for s in sites for path in self.workdir.glob(f"usage-{s}/*.counts")]

    def settled_placement(self, timeout: float = 20.0) -> pb.Placement:
        """The placement once two rounds in a row leave it unchanged.

        A round can leave work for the next (a minimum replica kept where it was
        while the region with demand gains its own copy, dropped a round later),
        so a test comparing placements across an event starts from a settled one.
        """
        deadline = time.monotonic() + timeout
        last = loaded_sets(self.placement())
        while time.monotonic() < deadline:
            time.sleep(2.2)  # two placement rounds
            placement = self.placement()
            now = loaded_sets(placement)
            if now == last:
                return placement
            last = now
        raise AssertionError(f"placement did not settle within {timeout} s: {last}")

    def standby_leads(self) -> pb.Placement:
        """The standby's placement once it (started, the first replica gone) says it
        leads."""
        standby = self.standby
        assert standby is not None

        def leading() -> pb.Placement | None:
            placement: pb.Placement = self.call("GetPlacement", pb.PlacementRequest(), standby)  # type: ignore[assignment]
            return placement if placement.leader == standby.replica else None

        return wait_until(leading, timeout=10, what="the standby leads")

    def first_replica_leads_again(self) -> None:
        """After a test failed the leader over to the standby: the first replica back
        (a standby at first), the standby stopped, and the first replica leading."""
        assert self.standby is not None
        self.cp.start()
        self.standby.stop()
        wait_until(
            lambda: self.placement().leader == self.cp.replica,  # type: ignore[attr-defined]
            timeout=20, what="the first replica leads again",
        )  # fmt: skip

    def loaded_at(self, site: str) -> set[str]:
        for sp in self.placement().sites:
            if sp.site_id == site:
                return set(sp.loaded)
        return set()

    def start_agent(
        self,
        site: str,
        region: str,
        extra_env: dict[str, str] | None = None,
        tls_ca: Path | None = None,
    ) -> AgentProcess:
        repo = self.workdir / f"repo-{site}"
        repo.mkdir(exist_ok=True)
        broker = self.regional.get(region)
        joined = fleet_env(self.cp, (broker or self.mqtt).url(), site, region)
        if broker is not None:
            broker.reload()  # the control plane reloads only its own broker
        agent = start_agent(
            repo,
            self.workdir,
            env={
                **joined,
                "EDGEPLEX_AGENT_FLEET__CONTROL_PLANE": ",".join(
                    cp.address for cp in (self.cp, self.standby) if cp is not None
                ),
                "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": "256MiB",
                "EDGEPLEX_AGENT_PRESTAGE": "false",
                **(extra_env or {}),
            },
            tls_ca=tls_ca,
        )
        self.agents[site] = agent
        return agent


@contextmanager
def running_fleet(workdir: Path, **cp_env: str) -> Iterator[Fleet]:
    """Redis, mosquitto and a control plane (`cp_env`: its settings) started in
    `workdir`, as a Fleet; the agents started on it, then they, stopped when the
    block ends."""
    r, m = RedisServer(workdir), Mosquitto(workdir)
    r.start()
    m.start()
    cp = ControlPlane(workdir, r, m.url(), **cp_env)
    cp.start()
    fleet = Fleet(workdir, r, m, cp)
    try:
        yield fleet
    finally:
        for agent in fleet.agents.values():
            agent.stop()
        cp.stop()
        m.stop()
        r.stop()


def agent_tier(agent: AgentProcess, model: str) -> str:
    _status, body = agent.http_get("/edgeplex/v1/status")
    for entry in json.loads(body):
        if entry["name"] == model:
            return str(entry["tier"])
    return ""


def rejected_messages(agent: AgentProcess) -> float:
    """Control messages the agent refused so far, every reason together."""
    _, body = agent.http_get("/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith("edgeplex_agent_rejected_messages_total{")
    )
