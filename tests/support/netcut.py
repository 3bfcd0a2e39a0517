"""A link cut on loopback, as a partition cuts it: every packet to a port dropped
(iptables), no reset and no FIN, so the peer's kernel acknowledges nothing."""

from __future__ import annotations

import os
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
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    subprocess.run(["iptables", "-w", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-w", "-D", *rule], check=True)
