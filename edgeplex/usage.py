"""Usage records as the agents' journals hold them, for both the agent that writes
and sends them and the tools that read a journal where it lies (`edgeplex admin
usage --journal`): one tab-separated line per request, folded into one record per
(tenant, model, version) and minute, and that minute as the control plane stores
it (`UsageReport`). The journal itself is agent/observability/usage.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgeplex.proto import edgeplex_control_pb2 as pb

SUFFIX = ".usage"  # a minute's journal file: <minute>.usage
_FIELDS = 9


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
    """A minute file's lines as one record per (tenant, model, version). A line cut
    short by a crash (no newline, or too few fields) is not counted: its request's
    answer had not left; nor is the zeroed tail of a file still mapped or left by a
    crash."""
    records: dict[tuple[str, str, str], Record] = {}
    model_requests: dict[tuple[str, str], int] = {}
    model_bytes: dict[tuple[str, str], int] = {}
    with path.open("rb") as journal:
        for raw in journal:
            if not raw.endswith(b"\n"):
                continue
            parts = raw.decode(errors="replace").rstrip("\n").split("\t")
            if len(parts) != _FIELDS:
                continue
            tenant, model, version, failure, b_in, b_out, compute_us, cold, held = parts
            key = (tenant, model, version)
            record = records.get(key) or records.setdefault(key, Record(*key))
            record.requests += 1
            if failure:
                record.failures[failure] = record.failures.get(failure, 0) + 1
            record.bytes_in += int(b_in)
            record.bytes_out += int(b_out)
            record.compute_s += int(compute_us) / 1e6
            record.cold_starts += cold == "1"
            model_requests[(model, version)] = model_requests.get((model, version), 0) + 1
            model_bytes[(model, version)] = max(model_bytes.get((model, version), 0), int(held))
    for record in records.values():
        mv = (record.model, record.version)
        share = record.requests / model_requests[mv]
        record.device_byte_seconds = model_bytes[mv] * interval_s * share
    return sorted(records.values(), key=lambda r: (r.tenant, r.model, r.version))


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
