"""Usage records: what each tenant used at this site, minute by minute, kept so that
billing from them loses nothing and counts nothing twice.

Every request served here, and every one its tenant's limits refused, is counted in
the journal file of the minute it ended in (`<minute>.counts` in the spool
directory) before its answer leaves: its entry's counters for (tenant, model,
version, failure), laid out as edgeplex/usage.py says, are added to in place. The
file is mapped shared, so a count is in the kernel's page cache as soon as it is
stored, with no system call on the request path, and an agent killed at any
instant has on disk every request it answered. A request's count is stored after
its bytes and compute time, so the most a kill can leave is the bytes of the one
request whose answer had not left. A kill after a batch was counted and before its
answers left leaves those requests counted, though their callers got an error. A
new entry's head is stored last: one cut short is not read, and a restart within
the minute writes over it.

A minute closes `grace_s` after it ends. `fold` (edgeplex/usage.py) then turns its
file into one record per (tenant, model, version): the requests, failures by
reason, bytes in and out, runner compute time (a batch's execution time divided
among its requests), cold starts caused, and the device memory the model held over
the minute, attributed by share of requests. The fleet link sends a closed minute
to the control plane keyed by (site, minute) and removes its file once
acknowledged: sending a minute again stores the same record in the same place, so
a lost acknowledgement, an agent restart or a control-plane failover neither loses
nor doubles it.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from edgeplex.usage import (
    BYTES_IN,
    BYTES_OUT,
    COLD_STARTS,
    COMPUTE_NS,
    COUNTS,
    HELD,
    MAGIC,
    REQUESTS,
    SUFFIX,
    Key,
    entries,
    key_bytes,
    minute_files,
)

_CHUNK = 1 << 16  # a minute file grows by this much at a time
# Entries a minute may hold; past it a request is counted under its tenant and
# failure with no model, so callers naming models that do not exist cannot grow
# the file and this process without bound.
_KEYS = 16_384
_WORDS = 1 + COUNTS  # an entry's head and counts, before its key


class Journal:
    """The spool directory's minute files, counted into on the request path."""

    def __init__(self, directory: Path, interval_s: int = 60, grace_s: float = 2.0) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.grace_s = grace_s
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._words: memoryview | None = None  # the mapping as 8-byte integers
        self._end = 0  # where the next entry goes, in bytes
        self._until = 0.0  # when the mapped minute ends (time.time())
        self._at: dict[Key, int] = {}  # an entry's counts, as a word index

    def record(
        self,
        tenant: str,
        model: str,
        version: str,
        failure: str = "",
        bytes_in: int = 0,
        bytes_out: int = 0,
        compute_s: float = 0.0,
        cold: int = 0,
        model_bytes: int = 0,
        requests: int = 1,
    ) -> None:
        """`requests` requests (one, or a batch's of one tenant) and what they used,
        counted in the minute they end in: `cold` of them caused a cold start, the
        model held `model_bytes` on the device."""
        now = time.time()
        if now >= self._until:
            self._open(int(now) // self.interval_s)
        key = (tenant, model, version, failure)
        at = self._at.get(key)
        if at is None:
            at = self._add(key)
        words = self._words
        assert words is not None
        words[at + BYTES_IN] += bytes_in
        words[at + BYTES_OUT] += bytes_out
        if compute_s:
            words[at + COMPUTE_NS] += round(compute_s * 1e9)
        if cold:
            words[at + COLD_STARTS] += cold
        if model_bytes > words[at + HELD]:
            words[at + HELD] = model_bytes
        words[at + REQUESTS] += requests  # last: requests are counted whole or not at all

    def closed(self, now: float | None = None) -> list[tuple[int, Path]]:
        """The minutes that have ended (and their grace passed), oldest first."""
        now = time.time() if now is None else now
        current = int(now - self.grace_s) // self.interval_s
        return [(minute, path) for minute, path in minute_files(self.directory) if minute < current]

    def close(self) -> None:
        """The current minute's file cut to its entries (the unused tail of the
        mapping dropped) and closed."""
        self._unmap()
        if self._fd >= 0:
            os.ftruncate(self._fd, self._end)
            os.close(self._fd)
            self._fd = -1
        self._at = {}

    def _add(self, key: Key) -> int:
        """A new entry for `key`, its head stored last; the index of its counts."""
        if len(self._at) >= _KEYS and key[1]:
            key = (key[0], "", "", key[3])
            if (at := self._at.get(key)) is not None:
                return at
        text = key_bytes(key)
        start = self._end
        end = start + 8 * _WORDS + len(text) + (-len(text) % 8)
        assert self._map is not None
        if end > len(self._map):
            self._unmap()
            os.ftruncate(self._fd, end + _CHUNK)
            self._map = mmap.mmap(self._fd, end + _CHUNK)
            self._words = memoryview(self._map).cast("q")
        self._map[start + 8 * _WORDS : start + 8 * _WORDS + len(text)] = text
        words = self._words
        assert words is not None
        words[start // 8] = MAGIC << 32 | len(text)  # the head last: the entry is whole
        self._end = end
        at = self._at[key] = start // 8 + 1
        return at

    def _open(self, minute: int) -> None:
        """Map `minute`'s file, after its last whole entry (an agent restarted within
        the minute counts on, over an entry its crash cut short)."""
        self.close()
        path = self.directory / f"{minute}{SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        end = 0
        if size := os.fstat(fd).st_size:
            for key, _, start, after in entries(os.pread(fd, size, 0)):
                self._at[key], end = start // 8 + 1, after
        os.ftruncate(fd, end)  # an entry cut short and a crash's unused tail: gone
        os.ftruncate(fd, end + _CHUNK)  # ...and room ahead, zeros
        self._fd, self._end = fd, end
        self._map = mmap.mmap(fd, end + _CHUNK)
        self._words = memoryview(self._map).cast("q")
        self._until = (minute + 1) * self.interval_s

    def _unmap(self) -> None:
        if self._words is not None:
            self._words.release()
            self._words = None
        if self._map is not None:
            self._map.close()
            self._map = None


class Answered(Protocol):
    """What the journal reads of a request its batcher answered (batching/policy.py's
    Request)."""

    tenant: str
    batch_size: int
    outputs: list[str] | None
    cold_start: str


class Model(Protocol):
    """The model version whose batches are counted (a residency record is one)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def device_bytes(self) -> int: ...


class BatchUsage:
    """A model version's served requests, counted a batch at a time by its batcher as
    it hands the batch's answers out (before any of them leaves): one update of the
    journal per tenant in the batch, not one per request. A request's bytes are its
    rows of the batch's tensors, its compute time an equal share of the batch's.
    Requests that fail are counted by the core, one at a time."""

    def __init__(self, journal: Journal, model: Model) -> None:
        self.journal = journal
        self.model = model

    def __call__(
        self,
        served: Sequence[Answered],
        batch_len: int,
        rows: int,
        bytes_in: int,
        outputs: dict[str, np.ndarray],
        compute_ns: int,
    ) -> None:
        """`served`: the requests answered, of a batch of `batch_len` requests and
        `rows` rows (0: a model that does not batch, one request) whose inputs took
        `bytes_in` and whose `outputs` these are."""
        model, record = self.model, self.journal.record
        share_s = compute_ns / 1e9 / batch_len
        bytes_out = sum(a.nbytes for a in outputs.values())
        first, cold = served[0].tenant, 0
        for r in served:
            if r.tenant != first or r.outputs is not None:
                break
            cold += bool(r.cold_start)
        else:
            if len(served) == batch_len:  # one tenant's whole batch, every output
                record(first, model.name, model.version, "", bytes_in, bytes_out,
                       share_s * batch_len, cold, model.device_bytes, batch_len)  # fmt: skip
                return
        batching, rows = rows > 0, rows or 1
        by_tenant: dict[str, list[int]] = {}
        for r in served:
            size = r.batch_size if batching else 1
            out = bytes_out if r.outputs is None else _subset(r, outputs)
            each = by_tenant.get(r.tenant) or by_tenant.setdefault(r.tenant, [0, 0, 0, 0])
            each[0] += 1
            each[1] += bytes_in * size // rows
            each[2] += out * size // rows
            each[3] += bool(r.cold_start)
        for tenant, (requests, b_in, b_out, cold) in by_tenant.items():
            record(tenant, model.name, model.version, "", b_in, b_out, share_s * requests,
                   cold, model.device_bytes, requests)  # fmt: skip


def _subset(request: Answered, outputs: dict[str, np.ndarray]) -> int:
    """The bytes of the outputs `request` asked for, of all the batch's rows."""
    assert request.outputs is not None
    return sum(outputs[n].nbytes for n in request.outputs if n in outputs)
