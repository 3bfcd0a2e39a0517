"""Usage records as the agents' journals hold them, for both the agent that writes
and sends them and the tools that read a journal where it lies (`edgeplex admin
usage --journal`): one file per minute, folded into one record per (tenant, model,
version) and that minute as the control plane stores it (`UsageReport`). The
journal itself is agent/observability/usage.py.

A minute file (`<minute>.counts`) is a run of entries, one per (tenant, model,
version, failure) seen in the minute, each of 8-byte words in the machine's byte
order (a journal is read where it was written):

    head        MAGIC << 32 | the key's length in bytes (stored last: an entry
                without its head is one a crash cut short, and ends the file)
    counts      requests, bytes in, bytes out, compute ns, cold starts, and the
                most device bytes the model held
    key         JSON [tenant, model, version, failure], zero-padded to 8 bytes

and zeros after the last entry. Agents before this format wrote one tab-separated
line per request (`<minute>.usage`); those files are still folded, so an agent
upgraded with minutes not yet sent loses none of them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgeplex.proto import edgeplex_control_pb2 as pb

SUFFIX = ".counts"  # a minute's journal file: <minute>.counts
LINES = ".usage"  # a minute's file from an agent that wrote one line per request
MAGIC = 0x45505553  # "EPUS"
REQUESTS, BYTES_IN, BYTES_OUT, COMPUTE_NS, COLD_STARTS, HELD = range(6)
COUNTS = 6
_COUNTS = struct.Struct(f"={COUNTS}q")
_HEAD = struct.Struct("=q")
_LINE_FIELDS = 9

Key = tuple[str, str, str, str]  # tenant, model, version, failure ("" when served)


def key_bytes(key: Key) -> bytes:
    """An entry's key as stored (before its padding)."""
    return json.dumps(key, separators=(",", ":")).encode()


def entries(data: bytes | memoryview) -> Iterator[tuple[Key, tuple[int, ...], int, int]]:
    """The whole entries of a minute file's bytes: (key, counts, where the entry's
    head is, where the next entry starts), in the order they were added."""
    at, words = 0, 8 * (1 + COUNTS)
    while at + words <= len(data):
        (head,) = _HEAD.unpack_from(data, at)
        size = head & 0xFFFFFFFF
        end = at + words + size + (-size % 8)
        if head >> 32 != MAGIC or end > len(data):
            return
        try:
            key = json.loads(bytes(data[at + words : at + words + size]))
        except ValueError:
            return
        if not (isinstance(key, list) and len(key) == 4 and all(isinstance(k, str) for k in key)):
            return
        yield (key[0], key[1], key[2], key[3]), _COUNTS.unpack_from(data, at + 8), at, end
        at = end


def minute_files(directory: Path) -> list[tuple[int, Path]]:
    """A journal directory's minute files, oldest first (both formats)."""
    found = []
    for path in directory.iterdir() if directory.is_dir() else ():
        if path.suffix in (SUFFIX, LINES) and path.stem.isdigit():
            found.append((int(path.stem), path))
    return sorted(found)


@dataclass
class Record:
    """One (tenant, model, version)'s use in one minute at one site."""

    tenant: str
    model: str
    version: str
    requests: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # by reason
    bytes_in: int = 0
    bytes_out: int = 0
    compute_s: float = 0.0
    cold_starts: int = 0
    device_byte_seconds: float = 0.0


def fold(path: Path, interval_s: int) -> list[Record]:
    """A minute file as one record per (tenant, model, version). The device memory a
    model held over the minute (the most it held while serving) is attributed to
    tenants by their share of its requests."""
    data = path.read_bytes()
    rows = _lines(data) if path.suffix == LINES else ((k, c) for k, c, _, _ in entries(data))
    records: dict[tuple[str, str, str], Record] = {}
    model_requests: dict[tuple[str, str], int] = {}
    model_bytes: dict[tuple[str, str], int] = {}
    for (tenant, model, version, failure), counts in rows:
        key = (tenant, model, version)
        record = records.get(key) or records.setdefault(key, Record(*key))
        requests = counts[REQUESTS]
        record.requests += requests
        if failure:
            record.failures[failure] = record.failures.get(failure, 0) + requests
        record.bytes_in += counts[BYTES_IN]
        record.bytes_out += counts[BYTES_OUT]
        record.compute_s += counts[COMPUTE_NS] / 1e9
        record.cold_starts += counts[COLD_STARTS]
        mv = (model, version)
        model_requests[mv] = model_requests.get(mv, 0) + requests
        model_bytes[mv] = max(model_bytes.get(mv, 0), counts[HELD])
    for record in records.values():
        mv = (record.model, record.version)
        share = record.requests / model_requests[mv] if model_requests[mv] else 0.0
        record.device_byte_seconds = model_bytes[mv] * interval_s * share
    return sorted(records.values(), key=lambda r: (r.tenant, r.model, r.version))


def _lines(data: bytes) -> Iterator[tuple[Key, tuple[int, ...]]]:
    """An older agent's minute file: one line per request. A line cut short by a
    crash (no newline, or too few fields) is not counted."""
    for raw in data.split(b"\n")[:-1]:
        parts = raw.decode(errors="replace").split("\t")
        if len(parts) != _LINE_FIELDS:
            continue
        tenant, model, version, failure, *numbers = parts
        try:
            b_in, b_out, compute_us, cold, held = (int(n) for n in numbers)
        except ValueError:
            continue
        yield (tenant, model, version, failure), (1, b_in, b_out, compute_us * 1000, cold, held)


def report_of(site_id: str, minute: int, interval_s: int, records: list[Record]) -> pb.UsageReport:
    report = pb.UsageReport(site_id=site_id, minute=minute, interval_s=interval_s)
    for r in records:
        report.records.append(
            pb.UsageRecord(
                tenant=r.tenant, model=r.model, version=r.version, requests=r.requests,
                failures=r.failures, bytes_in=r.bytes_in, bytes_out=r.bytes_out,
                compute_s=r.compute_s, cold_starts=r.cold_starts,
                device_byte_seconds=r.device_byte_seconds,
            )
        )  # fmt: skip
    return report
