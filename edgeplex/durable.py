"""Files that survive a crash whole or not at all: credentials and state.

Every write goes to a temporary file in the same directory (named
`.<name>.<pid>.*.tmp`, its mode set before a byte is written), is fsynced, then
renamed over (or, for a file that must be created only once, linked to) its
name, and the directory is fsynced. A kill at any point leaves the old file, the
new one, or a temporary file that `sweep_temporary` removes at the next start;
never an empty or half-written file.

`crash_point(name)` is the test hook: with EDGEPLEX_CRASH_AT=name in its
environment, a process kills itself there (tests/agent/test_crash_safety.py drives them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

_CRASH_AT = os.environ.get("EDGEPLEX_CRASH_AT", "")


def crash_point(name: str) -> None:
    """Test hook: die here, as a kill would, when EDGEPLEX_CRASH_AT names this point."""
    if name == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def write_atomic(path: Path, data: bytes, mode: int = 0o600, *, point: str = "") -> None:
    """Replace `path` with `data`, durably (see the module docstring)."""
    tmp = _write_temporary(path, data, mode, point)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)


def create_atomic(path: Path, data: bytes, mode: int = 0o600, *, point: str = "") -> bool:
    """Create `path` holding `data` unless it exists; True if this call created it."""
    tmp = _write_temporary(path, data, mode, point)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    _sync_dir(path.parent)
    return True


def sweep_temporary(directory: Path, name: str) -> int:
    """Remove the temporary files killed writers of `directory/name` left (those of a
    process that is gone: several processes may share a file); how many."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in directory.glob(f".{name}.*.tmp"):
            pid = entry.name[len(name) + 2 :].split(".", 1)[0]
            if pid.isdigit() and alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                entry.unlink()
                removed += 1
    return removed


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a dead writer's leftovers may be swept)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_temporary(path: Path, data: bytes, mode: int, point: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    prefix = f".{path.name}.{os.getpid()}."
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if point:
                crash_point(f"{point}:written")
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _sync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
