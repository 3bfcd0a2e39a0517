"""`edgeplex rig up|down|status`: a multi-site fleet on one Linux box (as root).

`up` builds the network (topology.py), starts Redis, mosquitto and the
control plane on the bridge address in the root namespace, then one agent per
site inside its namespace, and waits until every agent is ready. Everything
it starts and creates is recorded in `<state-dir>/rig.json`, so `down` can
remove exactly that (processes, namespaces, veths, the bridge) even after a
crash, and checks that nothing is left.

Inter-region delays use `tc netem`. On a kernel without the netem (or prio)
qdisc they come from a userspace TCP delay proxy per site instead
(delay_proxy.py, iptables REDIRECT); `status` says which.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

from edgeplex.rig.broker import Broker
from edgeplex.rig.topology import Topology, build, network_commands, proxy_args

STATE_FILE = "rig.json"


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done


def netem_available() -> bool:
    """Whether this kernel has the qdiscs the delays need (probed on a scratch veth)."""
    name = f"epxp{os.getpid() % 10000}"
    if _run(
        ["ip", "link", "add", name, "type", "veth", "peer", "name", name + "b"], False
    ).returncode:
        return False
    try:
        ok = _run(["tc", "qdisc", "add", "dev", name, "root", "handle", "1:", "prio"], False)
        netem = _run(
            ["tc", "qdisc", "add", "dev", name, "parent", "1:1", "netem", "delay", "1ms"], False
        )
        return ok.returncode == 0 and netem.returncode == 0
    finally:
        _run(["ip", "link", "del", name], False)


class Rig:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.state_path = state_dir / STATE_FILE
        # The one folder file:// artifacts may come from, for the control plane and sites.
        self.artifact_root = state_dir / "artifacts"

    # --- state ----------------------------------------------------------------------------

    def load(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else {}

    def save(self, state: dict) -> None:  # type: ignore[type-arg]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_path)

    # --- up -------------------------------------------------------------------------------

    def up(
        self,
        topo: Topology,
        agent_env: dict[str, str] | None = None,
        cp_env: dict[str, str] | None = None,
    ) -> dict:  # type: ignore[type-arg]
        """Bring the rig up; `agent_env` and `cp_env` add to or override the agents'
        and the control plane's environment (their settings)."""
        if self.load().get("sites"):
            raise RuntimeError(f"a rig is already up (state in {self.state_dir}); `rig down` first")
        netem = netem_available()
        needed = ["ip", "redis-server"] + ([] if netem else ["iptables"])
        for binary in needed:
            if shutil.which(binary) is None:
                raise RuntimeError(f"{binary} not found (make setup installs it)")
        state: dict = {  # type: ignore[type-arg]
            "topology": _topology_json(topo),
            "netem": netem,
            "pids": {},
            "sites": [asdict(s) for s in topo.sites],
        }
        self.save(state)  # before anything exists, so `down` can clean a half-built rig
        for cmd in network_commands(topo, netem):
            _run(cmd)
        _forward_within(topo.bridge, "-I")
        if not netem:  # delays in userspace: one TCP delay proxy per site namespace
            for site in topo.sites:
                state["pids"][f"delay-{site.site_id}"] = self._spawn(
                    f"delay-{site.site_id}",
                    ["ip", "netns", "exec", site.namespace, sys.executable, "-m",
                     "edgeplex.rig.delay_proxy", *proxy_args(topo, site)],
                )  # fmt: skip
            self.save(state)
        token = secrets.token_hex(16)
        (self.state_dir / "admin-token").write_text(token + "\n")
        (self.state_dir / "admin-token").chmod(0o600)
        gw = topo.gateway
        state["control_plane"] = f"{gw}:7070"
        redis_password = secrets.token_hex(16)
        state["redis"] = f"redis://:{redis_password}@{gw}:6379/0"
        state["mqtt"] = Broker(self.state_dir).configure(gw)  # the control plane's user
        state["pids"]["redis"] = self._spawn(
            "redis", ["redis-server", "--bind", gw, "--port", "6379", "--dir", str(self.state_dir),
                      "--appendonly", "yes", "--save", "", "--requirepass", redis_password],
        )  # fmt: skip
        state["pids"]["mosquitto"] = self._spawn(
            "mosquitto",
            [
                shutil.which("mosquitto") or "/usr/sbin/mosquitto",
                "-c",
                str(self.state_dir / "mosquitto.conf"),
            ],
        )
        self.save(state)
        _wait_tcp(gw, 6379)
        _wait_tcp(gw, 1883)
        latency = {f"{a},{b}": d for (a, b), d in topo.delays_ms.items()}
        cp_env = {
            "EDGEPLEX_ADMIN_TOKEN": token,
            "EDGEPLEX_CP_GRPC_HOST": gw,
            "EDGEPLEX_CP_INSECURE": "true",  # the rig's own closed network
            "EDGEPLEX_CP_REGION_LATENCY_MS": json.dumps(latency),
            "EDGEPLEX_CP_REGION_CLOCK_OFFSET_H": json.dumps(topo.clock_offsets_h),
            "EDGEPLEX_CP_PLACEMENT_INTERVAL_S": "2",
            "EDGEPLEX_CP_SITE_LEASE_S": "4",
            "EDGEPLEX_CP_REPORT_INTERVAL_S": "0.5",
            "EDGEPLEX_CP_DEMAND_HALF_LIFE_S": "1",
            "EDGEPLEX_CP_ARTIFACT_DIR": str(self.state_dir / "cp-artifacts"),
            **Broker(self.state_dir).control_plane_env(),
            # file:// artifacts only from the rig's own folder (docs/security.md)
            "EDGEPLEX_CP_ARTIFACT_FILE_ROOTS": json.dumps([str(self.artifact_root)]),
            **(cp_env or {}),
        }
        state["pids"]["control-plane"] = self._spawn(
            "control-plane",
            [sys.executable, "-m", "edgeplex", "control-plane", "--redis", state["redis"],
             "--mqtt", state["mqtt"], "--grpc-port", "7070"],
            env=cp_env,
        )  # fmt: skip
        self.save(state)
        try:
            _wait_tcp(gw, 7070)
        except RuntimeError as exc:
            tail = self._log_tail("control-plane")
            raise RuntimeError(f"the control plane: {exc}{tail}") from None
        for site in topo.sites:
            state["pids"][site.site_id] = self.start_agent(state, site.site_id, agent_env)
            self.save(state)
        for site in topo.sites:
            try:
                _wait_http(f"http://{site.http}/v2/health/ready", 90)
            except RuntimeError as exc:
                tail = self._log_tail(f"agent-{site.site_id}")
                raise RuntimeError(f"site {site.site_id}: {exc}{tail}") from None
        return state

    def _log_tail(self, name: str, lines: int = 20) -> str:
        """The end of a part's log, for an error that says it did not start."""
        try:
            text = (self.state_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return f" (no {name}.log)"
        return f"; {name}.log ends:\n" + "\n".join(text.splitlines()[-lines:])

    def start_agent(
        self, state: dict, site_id: str, extra_env: dict[str, str] | None = None
    ) -> int:  # type: ignore[type-arg]
        site = next(s for s in state["sites"] if s["site_id"] == site_id)
        repo = self.state_dir / "sites" / site_id
        join_token, mqtt_password = self._add_site(state, site_id, site["region"])
        broker = state["mqtt"].rpartition("@")[2]
        repo.mkdir(parents=True, exist_ok=True)
        env = {
            "EDGEPLEX_AGENT_FLEET__CONTROL_PLANE": state["control_plane"],
            "EDGEPLEX_AGENT_FLEET__SITE_ID": site_id,
            "EDGEPLEX_AGENT_FLEET__REGION": site["region"],
            "EDGEPLEX_AGENT_GRPC_HOST": site["address"],
            "EDGEPLEX_AGENT_HTTP_HOST": site["address"],
            "EDGEPLEX_AGENT_SECURITY__INSECURE": "true",  # the rig's private namespaces
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN_FILE": str(self.state_dir / "admin-token"),
            "EDGEPLEX_AGENT_FLEET__JOIN_TOKEN": join_token,
            "EDGEPLEX_AGENT_FLEET__MQTT_URL": f"mqtt://{site_id}:{mqtt_password}@{broker}",
            # The rig's own network namespaces: a closed network, no TLS.
            "EDGEPLEX_AGENT_FLEET__ALLOW_PLAINTEXT": "true",
            "EDGEPLEX_AGENT_FLEET__TRUST_FILE": str(self.state_dir / f"trust-{site_id}.pub"),
            "EDGEPLEX_AGENT_FLEET__ARTIFACT_FILE_ROOTS": json.dumps([str(self.artifact_root)]),
            "EDGEPLEX_AGENT_PRESTAGE": "false",
            "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": "256MiB",
            **(extra_env or {}),
        }
        cmd = ["ip", "netns", "exec", site["namespace"], sys.executable, "-m", "edgeplex", "agent",
               "--model-repo", str(repo), "--grpc-port", "8001", "--http-port", "8000"]  # fmt: skip
        return self._spawn(f"agent-{site_id}", cmd, env=env)

    def _add_site(self, state: dict, site_id: str, region: str) -> tuple[str, str]:  # type: ignore[type-arg]
        """`edgeplex admin site add`: a fresh join token and broker password for the
        site (the last ones are revoked, so a restarted agent joins with valid ones)."""
        import grpc

        from edgeplex.proto import edgeplex_control_pb2 as pb
        from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc

        token = (self.state_dir / "admin-token").read_text().strip()
        with grpc.insecure_channel(state["control_plane"]) as channel:
            reply = pb_grpc.AdminServiceStub(channel).AddSite(
                pb.AddSiteRequest(site_id=site_id, region=region),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=10,
            )
        return reply.join_token, reply.mqtt_password

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> int:
        log = (self.state_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=self.state_dir,
        )
        return process.pid

    # --- down -----------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop and remove everything the rig made; returns what is still left (empty)."""
        state = self.load()
        if not state:
            return []
        topo = state["topology"]
        pids = list(state.get("pids", {}).values())
        for site in state.get("sites", []):
            pids += _netns_pids(site["namespace"])
        _stop(pids)
        for site in state.get("sites", []):
            _stop(_netns_pids(site["namespace"]))
            _run(["ip", "netns", "del", site["namespace"]], False)
            _run(["ip", "link", "del", site["host_veth"]], False)
        _run(["ip", "link", "del", f"{topo['prefix']}br"], False)
        _forward_within(f"{topo['prefix']}br", "-D")
        left = leftovers(state)
        if not left:
            self.state_path.unlink(missing_ok=True)
        return left

    # --- status ---------------------------------------------------------------------------

    def status(self) -> str:
        state = self.load()
        if not state:
            return "no rig is up"
        delays = "tc netem" if state["netem"] else "userspace TCP proxy (no netem in this kernel)"
        lines = [
            f"control plane {state['control_plane']}  mqtt {state['mqtt'].rpartition('@')[2]}",
            f"inter-region delays: {delays}  {state['topology']['delays_ms']}",
            f"admin token: {self.state_dir / 'admin-token'}",
            "SITE   REGION  ADDRESS            UP   LOADED",
        ]
        for site in state["sites"]:
            running = alive(state["pids"].get(site["site_id"]))
            loaded = ""
            try:
                with urllib.request.urlopen(
                    f"http://{site['address']}:8000/edgeplex/v1/status", timeout=2
                ) as reply:
                    loaded = " ".join(e["name"] for e in json.load(reply) if e["tier"] == "loaded")
            except OSError:
                loaded = "(not answering)"
            lines.append(
                f"{site['site_id']:<6} {site['region']:<7} {site['address'] + ':8001':<18} "
                f"{'yes' if running else 'no':<4} {loaded}"
            )
        return "\n".join(lines)


def _forward_within(bridge: str, action: str) -> None:
    """Insert (-I) or delete (-D) a FORWARD rule that accepts traffic between the
    rig's sites: with bridge netfilter on, a DROP policy (a Docker engine sets one)
    would otherwise cut them off from each other."""
    if shutil.which("iptables") is not None:
        _run(["iptables", action, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"], False)


def leftovers(state: dict) -> list[str]:  # type: ignore[type-arg]
    """Namespaces, links and processes of this rig that still exist."""
    left = []
    namespaces = _run(["ip", "netns", "list"], False).stdout
    links = _run(["ip", "-o", "link"], False).stdout
    for site in state.get("sites", []):
        if site["namespace"] in namespaces.split():
            left.append(f"namespace {site['namespace']}")
        if f" {site['host_veth']}@" in links or f" {site['host_veth']}:" in links:
            left.append(f"link {site['host_veth']}")
    bridge = f"{state['topology']['prefix']}br"
    if f" {bridge}:" in links:
        left.append(f"link {bridge}")
    for name, pid in state.get("pids", {}).items():
        if alive(pid):
            left.append(f"process {name} ({pid})")
    return left


def _topology_json(topo: Topology) -> dict:  # type: ignore[type-arg]
    return {
        "prefix": topo.prefix,
        "octet": topo.octet,
        "regions": list(topo.regions),
        "delays_ms": {f"{a},{b}": d for (a, b), d in topo.delays_ms.items()},
        "clock_offsets_h": topo.clock_offsets_h,
    }


def _netns_pids(namespace: str) -> list[int]:
    out = _run(["ip", "netns", "pids", namespace], False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def alive(pid: int | None) -> bool:
    """Whether `pid` runs (a zombie does not count)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    """Signal the process group `pid` leads (its session), else the process."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _stop(pids: list[int], timeout: float = 15.0) -> None:
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        _reap()
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            _signal(pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _wait_tcp(host: str, port: int, timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port}")


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {timeout:g} s")


def build_topology(args) -> Topology:  # type: ignore[no-untyped-def]
    delays = tuple(float(x) for x in args.delays.split(",")) if args.delays else None
    offsets = tuple(float(x) for x in args.clock_offsets.split(",")) if args.clock_offsets else None
    return build(args.regions, args.sites_per_region, args.prefix, args.octet, delays, offsets)
