"""The sweep of what dead agents left: a live agent's directories are never taken,
not even while the agent is still claiming one."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeplex.agent.runners import leftovers


def test_a_directory_being_claimed_is_never_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another agent's sweep at the worst moment of a claim: after the lock file
    exists and before it is locked."""
    directory = tmp_path / f"{leftovers.RUNTIME}{os.getpid()}-live"
    directory.mkdir()
    flock = fcntl.flock
    swept: list[list[Path]] = []

    def sweep_first(fd: int, operation: int) -> None:
        if not swept:  # the claim's own lock: another agent sweeps just before it
            swept.append([])  # (the sweep's own locks pass straight through)
            swept[0] = leftovers.sweep([tmp_path])
        flock(fd, operation)

    monkeypatch.setattr(leftovers.fcntl, "flock", sweep_first)
    leftovers.claim(directory)
    assert swept == [[]] and directory.is_dir()
    monkeypatch.setattr(leftovers.fcntl, "flock", flock)
    assert leftovers.sweep([tmp_path]) == []  # claimed: locked by this live process


def test_a_dead_agents_directory_is_swept(tmp_path: Path) -> None:
    directory = tmp_path / f"{leftovers.RUNTIME}1-dead"
    directory.mkdir()
    code = (
        "import pathlib, sys\n"
        "from edgeplex.agent.runners import leftovers\n"
        "leftovers.claim(pathlib.Path(sys.argv[1]))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True)  # then exits
    assert (directory / leftovers.LOCK).exists()  # its owner exited: the lock is free
    assert leftovers.sweep([tmp_path]) == [directory] and not directory.exists()
