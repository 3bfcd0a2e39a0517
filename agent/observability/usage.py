"""Usage records: what each tenant used at this site, minute by minute, kept so that
billing from them loses nothing and counts nothing twice.

Every request served here, and every one its tenant's limits refused, appends one
line to the journal file of the minute it ended in (`<minute>.usage` in the spool
directory) before its answer leaves. The file is mapped shared, so a line is in the
kernel's page cache as soon as it is copied, with no system call on the request
path: an agent killed at any instant has on disk every request it answered (its
newline is stored last, so a line cut short is seen as such). A minute closes
`grace_s` after it ends. `fold` (edgeplex/usage.py) then turns its file into one
record per (tenant, model, version): the requests, failures by reason, bytes in and out, runner
compute time (a batch's execution time divided among its requests), cold starts
caused, and the device memory the model held over the minute, attributed by share
of requests. The fleet
link sends a closed minute to the control plane keyed by (site, minute) and removes
its file once acknowledged: sending a minute again stores the same record in the
same place, so a lost acknowledgement, an agent restart or a control-plane failover
neither loses nor doubles it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from pathlib import Path

from edgeplex.usage import SUFFIX

_CHUNK = 1 << 20  # a minute file grows by this much at a time
_HEADS = 4096  # (tenant, model, version, failure) line heads kept encoded


class Journal:
    """The spool directory's minute files, appended to on the request path."""

    def __init__(self, directory: Path, interval_s: int = 60, grace_s: float = 2.0) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.grace_s = grace_s
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._end = 0  # where the next line goes
        self._until = 0.0  # when the mapped minute ends (time.time())
        self._heads: dict[tuple[str, str, str, str], bytes] = {}

    def record(
        self,
        tenant: str,
        model: str,
        version: str,
        failure: str = "",
        bytes_in: int = 0,
        bytes_out: int = 0,
        compute_s: float = 0.0,
        cold: bool = False,
        model_bytes: int = 0,
    ) -> None:
        """One request's line, in the file of the minute it ends in."""
        now = time.time()
        if now >= self._until:
            self._open(int(now) // self.interval_s)
        key = (tenant, model, version, failure)
        head = self._heads.get(key)
        if head is None:  # the names' part of the line, encoded once per key
            if len(self._heads) >= _HEADS:
                self._heads = {}
            head = self._heads[key] = f"{tenant}\t{model}\t{version}\t{failure}\t".encode()
        line = head + b"%d\t%d\t%d\t%d\t%d" % (
            bytes_in,
            bytes_out,
            round(compute_s * 1e6),
            cold,
            model_bytes,
        )
        start, size = self._end, len(line) + 1
        mapped = self._map
        assert mapped is not None
        if start + size > len(mapped):
            mapped.resize(start + size + _CHUNK)
        mapped[start : start + size - 1] = line
        mapped[start + size - 1] = 10  # the newline last: the line is whole once it is there
        self._end = start + size

    def closed(self, now: float | None = None) -> list[tuple[int, Path]]:
        """The minutes that have ended (and their grace passed), oldest first."""
        now = time.time() if now is None else now
        current = int(now - self.grace_s) // self.interval_s
        found = []
        for path in self.directory.glob("*" + SUFFIX):
            with contextlib.suppress(ValueError):
                minute = int(path.stem)
                if minute < current:
                    found.append((minute, path))
        return sorted(found)

    def close(self) -> None:
        """The current minute's file cut to its lines (the unused tail of the mapping
        dropped) and closed."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.ftruncate(self._fd, self._end)
            os.close(self._fd)
            self._fd = -1

    def _open(self, minute: int) -> None:
        """Map `minute`'s file, after the last whole line already in it (an agent
        restarted within the minute appends, over a line its crash cut short)."""
        self.close()
        path = self.directory / f"{minute}{SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        end = 0
        if size := os.fstat(fd).st_size:
            with mmap.mmap(fd, size) as old:
                end = old.rfind(b"\n") + 1
        os.ftruncate(fd, end)  # a cut line and a crash's unused tail: gone
        os.ftruncate(fd, end + _CHUNK)  # ...and room ahead, zeros
        self._fd, self._map, self._end = fd, mmap.mmap(fd, end + _CHUNK), end
        self._until = (minute + 1) * self.interval_s
