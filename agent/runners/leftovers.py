"""What an agent keeps in /dev/shm and the temp directory while it runs (its staged
tier, its runners' rings and socket), and the sweep that removes what dead agents
left there.

Each such directory holds a lock file its agent keeps locked (flock) for its whole
life: the kernel drops the lock when the agent dies, however it dies, so a sweep
at the next start can tell a dead agent's directory from a live one's even across
PID namespaces. Called at the agent's start, before it makes its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import time
from pathlib import Path

from edgeplex.durable import alive

log = logging.getLogger("edgeplex.agent.runners")

# Each followed by the agent's pid and a random part.
STAGED, RINGS, RUNTIME = "edgeplex-staged-", "edgeplex-rings-", "edgeplex-agent-"
PREFIXES = (STAGED, RINGS, RUNTIME)
LOCK = ".owner"
GRACE_S = 60.0  # a directory without its lock yet may be one being made right now
_RING_FILE = re.compile(r"^edgeplex-(\d+)-[0-9a-f]{16}$")  # rings of earlier versions

_held: list[int] = []  # lock descriptors this process keeps open until it exits


def claim(directory: Path) -> None:
    """Mark `directory` as this live agent's (until the process exits). The lock file
    takes its name only once locked: a sweep that found it unlocked in between would
    take the directory for a dead agent's and remove it (another agent starting at
    the same moment did, once)."""
    making = directory / f"{LOCK}.{os.getpid()}"
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(making, directory / LOCK)
    _held.append(fd)


def sweep(parents: list[Path]) -> list[Path]:
    """Remove, under each of `parents`, the directories of agents that are gone;
    returns what was removed."""
    removed: list[Path] = []
    for parent in dict.fromkeys(parents):
        with contextlib.suppress(OSError):
            for entry in parent.iterdir():
                if _abandoned(entry):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                    removed.append(entry)
    if removed:
        log.warning("removed %d directories and files dead agents left", len(removed))
    return removed


def _abandoned(entry: Path) -> bool:
    match = _RING_FILE.match(entry.name)
    if match is not None:
        return not alive(int(match.group(1)))
    if not entry.name.startswith(PREFIXES) or not entry.is_dir() or entry.is_symlink():
        return False
    try:
        if entry.stat().st_uid != os.geteuid():
            return False  # another user's agent: not ours to judge
        fd = os.open(entry / LOCK, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        with contextlib.suppress(OSError):  # an earlier version's, or one being made
            return time.time() - entry.stat().st_mtime > GRACE_S and not alive(_pid(entry))
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True  # nobody holds it: its agent is gone
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _pid(entry: Path) -> int:
    digits = entry.name.split("-")[2] if entry.name.count("-") >= 3 else ""
    return int(digits) if digits.isdigit() else 0
