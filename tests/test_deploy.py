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
