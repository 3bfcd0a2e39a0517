"""Deployment units: systemd notify protocol, unit files that systemd accepts."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, start_agent

UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_units_verify(unit: Path, tmp_path: Path) -> None:
    edgeplex = shutil.which("edgeplex") or str(ROOT / ".venv" / "bin" / "edgeplex")
    text = unit.read_text().replace("/opt/edgeplex/venv/bin/edgeplex", edgeplex)
    (tmp_path / unit.name).write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / unit.name)], capture_output=True, text=True
    )
    problems = [
        line for line in done.stderr.splitlines() if unit.name in line and "ignoring" in line
    ]
    assert done.returncode == 0 and not problems, done.stderr
    for key in ("Type=notify", "WatchdogSec=", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        assert key in text


def test_agent_speaks_sd_notify(model_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(30)
    agent = start_agent(
        model_repo,
        tmp_path,
        env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"},
        wait_ready=False,
    )
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            "READY=1" in seen and seen.count("WATCHDOG=1") >= 3
        ):
            seen += sock.recv(4096).decode().splitlines()
        assert "READY=1" in seen and seen.count("WATCHDOG=1") >= 3, seen
        assert any(s.startswith("STATUS=serving") for s in seen)
        agent.process.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in seen:
            seen += sock.recv(4096).decode().splitlines()
        assert agent.process.wait(30) == 0
    finally:
        agent.stop()
        sock.close()


def test_compose_rig_matches_the_rig_topology() -> None:
    import yaml

    from edgeplex.rig.topology import build

    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "docker-compose.yml").read_text())
    agents = {k: v for k, v in compose["services"].items() if k.startswith("agent-")}
    topo = build(3, 2)
    assert sorted(agents) == sorted(f"agent-{s.site_id}" for s in topo.sites)
    addresses = set()
    for site in topo.sites:
        env = agents[f"agent-{site.site_id}"]["environment"]
        assert env["EDGEPLEX_AGENT_FLEET__SITE_ID"] == site.site_id
        assert env["EDGEPLEX_AGENT_FLEET__REGION"] == site.region
        address = env["EDGEPLEX_AGENT_FLEET__ADVERTISE_ADDRESS"]
        addresses.add(address)
        for item in env["EDGEPLEX_DELAYS"].split():
            subnet, ms = item.split("=")
            other = topo.regions[int(subnet.split(".")[2]) - 1]
            assert float(ms) == topo.delay(site.region, other)
    assert len(addresses) == 6
    # Locked down: each agent joins with the credentials enrolment wrote for it,
    # the broker takes users and an ACL, and nobody may register unannounced.
    services = compose["services"]
    enrolled = dict(
        item.split("=") for item in services["enroll"]["environment"]["EDGEPLEX_SITES"].split()
    )
    assert enrolled == {s.site_id: s.region for s in topo.sites}
    for name, agent in agents.items():
        assert agent["environment"]["EDGEPLEX_ENV_FILE"] == f"/enroll/{name[6:]}.env"
        assert "EDGEPLEX_AGENT_FLEET__MQTT_URL" not in agent["environment"]
    assert "edgeplex.rig.broker" in " ".join(services["mosquitto"]["command"])
    assert services["control-plane"]["pid"] == "service:mosquitto"
    assert "OPEN_REGISTRATION" not in str(compose)
    # Nothing from a registry: every service runs the image built here.
    assert {s["image"] for s in services.values()} == {"edgeplex:dev"}
    # The image: Debian from debootstrap, edgeplex from wheels, no network in the
    # build, an unprivileged user and a healthcheck; what it copies is in deploy/compose.
    dockerfile = (ROOT / "deploy" / "compose" / "Dockerfile").read_text()
    assert "FROM edgeplex-base:bookworm" in dockerfile
    assert "pip install --no-index" in dockerfile
    assert "\nUSER edgeplex\n" in dockerfile and "HEALTHCHECK" in dockerfile
    copied = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    # The dependencies' wheels, then the stage they were installed in, then edgeplex's.
    assert copied[:3] == ["wheels", "--from=dependencies", "edgeplex"]
    for name in copied[3:]:
        assert (ROOT / "deploy" / "compose" / name).is_file(), name
    # Agents alone start as root, to shape traffic; the entrypoint drops it.
    for name, service in services.items():
        assert service.get("user") == ("0" if name.startswith("agent-") else None), name
    assert "setpriv --reuid=edgeplex" in (ROOT / "deploy/compose/entrypoint.sh").read_text()


def test_compose_broker_files_lock_mosquitto_down(tmp_path: Path) -> None:
    """The compose broker container's first step, against Debian's mosquitto: no
    anonymous client connects, and the control plane's URL from cp.env does."""
    import asyncio
    import shutil

    import aiomqtt

    from edgeplex.fleet import parse_mqtt_url
    from tests.conftest import free_port
    from tests.services import wait_port

    port = free_port()
    init = [sys.executable, "-m", "edgeplex.rig.broker", "--dir", str(tmp_path)]
    subprocess.run(
        [*init, "--listen", "127.0.0.1", "--advertise", "127.0.0.1", "--port", str(port)],
        check=True,
        timeout=60,
    )
    env = dict(line.split("=", 1) for line in (tmp_path / "cp.env").read_text().splitlines())
    assert (tmp_path / "cp.env").stat().st_mode & 0o777 == 0o600
    assert env["EDGEPLEX_CP_MQTT_PASSWORD_FILE"] == str(tmp_path / "mosquitto.passwd")
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    broker = subprocess.Popen([binary, "-c", str(tmp_path / "mosquitto.conf")])
    try:
        wait_port(port)

        async def connect(url: str) -> None:
            async with aiomqtt.Client(**parse_mqtt_url(url).client_kwargs()):  # type: ignore[arg-type]
                pass

        asyncio.run(connect(env["EDGEPLEX_CP_MQTT_URL"]))
        with pytest.raises(aiomqtt.MqttError):
            asyncio.run(connect(f"mqtt://127.0.0.1:{port}"))
    finally:
        broker.terminate()
        broker.wait(10)
