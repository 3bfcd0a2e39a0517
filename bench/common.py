"""Helpers shared by the benchmarks: start an agent on free ports, talk to it."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from edgeplex.net import free_ports


def free_port() -> int:
    return free_ports(1)[0]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid`, all its threads (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (/proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Agent:
    """`edgeplex agent` as a subprocess; settings go in through EDGEPLEX_AGENT_* env."""

    def __init__(self, repo: Path, python: str = sys.executable, **settings: str) -> None:
        self.grpc_port, self.http_port = free_ports(2)
        self.http = f"127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        self.token = secrets.token_urlsafe(16)  # the admin token of this run's agent
        env = dict(os.environ, EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN=self.token)
        env.update({f"EDGEPLEX_AGENT_{k.upper()}": str(v) for k, v in settings.items()})
        self.log_path = Path(tempfile.gettempdir()) / f"edgeplex-bench-{self.http_port}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    python,
                    "-m",
                    "edgeplex",
                    "agent",
                    "--model-repo",
                    str(repo),
                    "--grpc-port",
                    str(self.grpc_port),
                    "--http-port",
                    str(self.http_port),
                    "--log-level",
                    "WARNING",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        for _ in range(1200):
            if self.proc.poll() is not None:
                raise SystemExit(f"agent exited: {self.log_path.read_text()[-2000:]}")
            try:
                if self.get("/v2/health/ready")[0] == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass  # not listening yet (or another listener: the agent then exits)
            time.sleep(0.1)
        raise SystemExit("agent not ready")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://{self.http}{path}", timeout=120) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(self, path: str, body: dict | None = None) -> int:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(
            f"http://{self.http}{path}",
            data=data,
            method="POST",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def status(self) -> dict[str, dict]:
        return {m["name"]: m for m in json.loads(self.get("/edgeplex/v1/status")[1])}

    def metrics(self) -> str:
        return self.get("/metrics")[1].decode()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample family, filtered by labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
