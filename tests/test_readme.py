"""The README's "A fleet on one box", pasted into a shell as a newcomer would: Redis,
mosquitto, a control plane, a site enrolled and joining, a model added; then the
control plane places the model at the site. It uses the README's own ports, so it
runs only where they are free, and everything it started is stopped."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PORTS = (6379, 1883, 7070, 8000, 8001)  # Redis, mosquitto, control plane, the agent

pytestmark = pytest.mark.slow


def block(heading: str) -> str:
    """The shell block (indented four spaces) under a README heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {heading}") :].split("\n## ", 1)[0]
    lines = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    return "\n".join(lines)


def in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_fleet_on_one_box_runs_as_pasted(tmp_path: Path) -> None:
    busy = [p for p in PORTS if in_use(p)]
    if busy:
        pytest.skip(f"the README's ports {busy} are in use here")
    demo = ROOT / ".cache" / "demo-repo"
    if not (demo / ".edgeplex-demo").exists():
        subprocess.run([str(ROOT / ".venv/bin/edgeplex"), "demo-repo", str(demo)], check=True)
    script = block("A fleet on one box")
    assert "admin site add" in script and "control-plane" in script
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEPLEX_")}
    shell = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script + "\nwait"],
        cwd=ROOT,
        env=env,
        stdout=(tmp_path / "out").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the control plane and agent it backgrounds: one group
    )
    try:
        token = _wait_for_token(tmp_path / "out", shell)
        admin = [str(ROOT / ".venv/bin/edgeplex"), "admin", "placement", "show"]
        admin_env = {**env, "EDGEPLEX_ADMIN_TOKEN": token}
        deadline, shown = time.monotonic() + 90, ""
        while time.monotonic() < deadline:
            shown = subprocess.run(
                admin, env=admin_env, capture_output=True, text=True, timeout=60
            ).stdout
            if re.search(r"mlp_small.*a1|a1.*mlp_small", shown, re.S):
                break
            time.sleep(1)
        output = (tmp_path / "out").read_text(errors="replace")
        assert "mlp_small" in shown and "a1" in shown, shown + output
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            shell.wait(30)
        subprocess.run(["redis-cli", "-p", "6379", "shutdown", "nosave"], capture_output=True)
        subprocess.run(["pkill", "-f", "mosquitto -p 1883 -d"], capture_output=True)


def _wait_for_token(out: Path, shell: subprocess.Popen[bytes]) -> str:
    """The admin token the pasted block exported (it echoes nothing: read it from
    the control plane's environment)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if os.getpgid(int(proc.name)) != shell.pid:
                    continue
                environ = (proc / "environ").read_bytes().split(b"\0")
            except (OSError, ProcessLookupError):
                continue
            for item in environ:
                if item.startswith(b"EDGEPLEX_ADMIN_TOKEN="):
                    return item.split(b"=", 1)[1].decode()
        if shell.poll() is not None:
            raise AssertionError(out.read_text(errors="replace"))
        time.sleep(0.2)
    raise AssertionError("the pasted block never started its control plane")
