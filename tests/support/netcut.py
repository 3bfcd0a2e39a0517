"""A link cut on loopback, as a partition cuts it: every packet to a port dropped
(iptables), no reset and no FIN, so the peer's kernel acknowledges nothing; or
only a process's open connections to a port cut, as a NAT or firewall that lost
their state cuts them, while new connections go through."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

needs_cut = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("iptables") is None,
    reason="cutting a link takes root and iptables",
)


@contextmanager
def cut(port: int) -> Iterator[None]:
    """Drop every packet to `port` on loopback until the block ends."""
    with _dropping([["--dport", str(port)]]):
        yield


@contextmanager
def cut_open_connections(pid: int, port: int) -> Iterator[None]:
    """Drop every packet, both ways, of the connections process `pid` holds open to
    `port` on loopback now, until the block ends; its later connections go through."""
    ours = subprocess.run(
        ["ss", "-Htnp", "state", "established", "dport", "=", f":{port}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    local_ports = [
        int(m.group(1))
        for line in ours.splitlines()
        if f"pid={pid}," in line and (m := re.search(r":(\d+)\s+\S+:\d+\s", line))
    ]
    assert local_ports, f"process {pid} holds no connection to port {port}:\n{ours}"
    flows = [
        ["--sport", str(a), "--dport", str(b)]
        for local in local_ports
        for a, b in ((local, port), (port, local))
    ]
    with _dropping(flows):
        yield


@contextmanager
def _dropping(matches: list[list[str]]) -> Iterator[None]:
    """A DROP rule on loopback's TCP for each of `matches` (iptables match options)
    while the block runs, every one removed after."""
    rules = [["INPUT", "-i", "lo", "-p", "tcp", *match, "-j", "DROP"] for match in matches]
    for rule in rules:
        subprocess.run(["iptables", "-w", "-I", *rule], check=True)
    try:
        yield
    finally:
        for rule in rules:
            subprocess.run(["iptables", "-w", "-D", *rule], check=True)
