"""Deployment units: systemd notify protocol, unit files that systemd accepts."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
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
    import tomllib

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
    # The image installs every package the project declares.
    dockerfile = (ROOT / "deploy" / "compose" / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for source in pyproject["tool"]["setuptools"]["package-dir"].values():
        assert f"COPY {source} ./{source}" in dockerfile
