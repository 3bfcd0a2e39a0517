"""Usage records at the control plane: each site's closed minutes, stored under
(minute, site) so a minute sent again replaces itself, and summed per tenant by
model, site or hour for `edgeplex admin usage`."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from edgeplex.proto import edgeplex_control_pb2 as pb

MAX_RECORDS = 100_000  # per report: a site's tenants x models in one minute


def check(report: pb.UsageReport) -> str:
    """Why a report cannot be stored ("" when it can)."""
    if report.interval_s <= 0 or report.interval_s > 3600:
        return "interval_s: 1 to 3600"
    if report.minute <= 0:
        return "minute: unix time / interval_s"
    if len(report.records) > MAX_RECORDS:
        return f"at most {MAX_RECORDS} records a minute"
    return ""


def summarize(
    reports: Iterable[pb.UsageReport], tenant: str, from_time: float, to_time: float, by: str
) -> pb.UsageTable:
    """Rows per (tenant, model | site | hour) of the reports' records in
    [from_time, to_time) (a minute counts where it starts)."""
    rows: dict[tuple[str, str], pb.UsageRow] = {}
    for report in reports:
        start = report.minute * report.interval_s
        if start < from_time or (to_time and start >= to_time):
            continue
        for record in report.records:
            if tenant and record.tenant != tenant:
                continue
            if by == "site":
                key = report.site_id
            elif by == "hour":
                hour = datetime.datetime.fromtimestamp(start - start % 3600, datetime.UTC)
                key = hour.strftime("%Y-%m-%dT%H:00Z")
            else:
                key = f"{record.model}:{record.version}" if record.version else record.model
            row = rows.get((record.tenant, key))
            if row is None:
                row = rows[(record.tenant, key)] = pb.UsageRow(tenant=record.tenant, key=key)
            row.requests += record.requests
            row.failures += sum(record.failures.values())
            row.bytes_in += record.bytes_in
            row.bytes_out += record.bytes_out
            row.compute_s += record.compute_s
            row.cold_starts += record.cold_starts
            row.device_byte_seconds += record.device_byte_seconds
    return pb.UsageTable(rows=[rows[k] for k in sorted(rows)])
