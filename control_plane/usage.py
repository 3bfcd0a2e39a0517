"""Usage records at the control plane: each site's closed minutes, summed into
the site's hours as they arrive (a minute sent again replaces itself), and summed
per tenant by model, site or hour for `edgeplex admin usage` and the dashboard.
Pure functions; usage_store.py keeps minutes and hours in Redis."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from edgeplex.proto import edgeplex_control_pb2 as pb

MAX_RECORDS = 100_000  # per report: a site's tenants x models in one minute
HOUR_S = 3600
DAY_S = 86_400
# What a usage table's rows are per, besides the tenant; for times, their key's form
# (UTC).
GROUPS = {
    "model": "",
    "site": "",
    "hour": "%Y-%m-%dT%H:00Z",
    "day": "%Y-%m-%d",
    "month": "%Y-%m",
}


class UsageGone(ValueError):
    """A range that cuts an hour whose minutes are no longer kept (only its sum is)."""


def check(report: pb.UsageReport) -> str:
    """Why a report cannot be stored ("" when it can)."""
    if report.interval_s <= 0 or report.interval_s > 3600:
        return "interval_s: 1 to 3600"
    if report.minute <= 0:
        return "minute: unix time / interval_s"
    if len(report.records) > MAX_RECORDS:
        return f"at most {MAX_RECORDS} records a minute"
    return ""


def start_of(report: pb.UsageReport) -> int:
    """When the report's interval starts, in unix seconds."""
    return report.minute * report.interval_s


def hour_of(report: pb.UsageReport) -> int:
    """The start of the hour a report counts in: the one its interval starts in."""
    start = start_of(report)
    return start - start % HOUR_S


def last_hours(now: float, hours: int) -> int:
    """The start of the last `hours` whole hours up to `now`: this hour so far and
    the `hours - 1` before it (a range that cuts no hour)."""
    return int(now - now % HOUR_S) - (hours - 1) * HOUR_S


def hour_sum(site_id: str, hour: int, reports: Iterable[pb.UsageReport]) -> pb.UsageReport:
    """A site's reports of one hour summed into one report of the hour (interval_s
    3600), one record per (tenant, model, version)."""
    return _sum(pb.UsageReport(site_id=site_id, minute=hour // HOUR_S, interval_s=HOUR_S), reports)


def day_sum(site_id: str, day: int, hours: Iterable[pb.UsageReport]) -> pb.UsageReport:
    """A site's hours of one UTC day summed into one report of the day (interval_s
    86400)."""
    return _sum(pb.UsageReport(site_id=site_id, minute=day // DAY_S, interval_s=DAY_S), hours)


def _sum(total: pb.UsageReport, reports: Iterable[pb.UsageReport]) -> pb.UsageReport:
    for report in reports:
        add(total, report)
    return total


def add(total: pb.UsageReport, report: pb.UsageReport) -> None:
    """Add `report`'s records into `total`'s, record by (tenant, model, version)."""
    records = {(r.tenant, r.model, r.version): r for r in total.records}
    for record in report.records:
        key = (record.tenant, record.model, record.version)
        into = records.get(key)
        if into is None:
            into = records[key] = total.records.add(
                tenant=record.tenant, model=record.model, version=record.version
            )
        for reason, count in record.failures.items():
            into.failures[reason] += count
        _add_counts(into, record)


def _add_counts(into: pb.UsageRecord | pb.UsageRow, record: pb.UsageRecord | pb.UsageRow) -> None:
    """The counts a usage record and a usage table's row both keep, added."""
    into.requests += record.requests
    into.bytes_in += record.bytes_in
    into.bytes_out += record.bytes_out
    into.compute_s += record.compute_s
    into.cold_starts += record.cold_starts
    into.device_byte_seconds += record.device_byte_seconds


def summarize(
    reports: Iterable[pb.UsageReport], tenant: str, from_time: float, to_time: float, by: str
) -> pb.UsageTable:
    """Rows per (tenant, model | site | hour | day | month) of the reports' records in
    [from_time, to_time) (a minute counts where it starts)."""
    summary = Summary(tenant, from_time, to_time, by)
    summary.add(reports)
    return summary.table()


class Summary:
    """`summarize`, fed a part at a time: what it holds is its rows, never the
    reports (a month of a large fleet's hourly sums is read in parts)."""

    def __init__(self, tenant: str, from_time: float, to_time: float, by: str) -> None:
        self.tenant, self.from_time, self.to_time, self.by = tenant, from_time, to_time, by
        self._rows: dict[tuple[str, str], pb.UsageRow] = {}

    def add(self, reports: Iterable[pb.UsageReport]) -> None:
        form = GROUPS[self.by]
        for report in reports:
            start = start_of(report)
            if start < self.from_time or (self.to_time and start >= self.to_time):
                continue
            # The row's key, where the report alone decides it: its site, or the hour,
            # day or month it starts in (an hour's sum: its own).
            fixed = report.site_id if self.by == "site" else None
            if form:
                fixed = datetime.datetime.fromtimestamp(start, datetime.UTC).strftime(form)
            for record in report.records:
                if self.tenant and record.tenant != self.tenant:
                    continue
                if fixed is not None:
                    key = fixed
                else:
                    key = f"{record.model}:{record.version}" if record.version else record.model
                row = self._row(record.tenant, key)
                row.failures += sum(record.failures.values())
                _add_counts(row, record)

    def merge(self, rows: Iterable[pb.UsageRow]) -> None:
        """Rows of another summary (of other reports, grouped alike), added in."""
        for other in rows:
            row = self._row(other.tenant, other.key)
            row.failures += other.failures
            _add_counts(row, other)

    def _row(self, tenant: str, key: str) -> pb.UsageRow:
        row = self._rows.get((tenant, key))
        if row is None:
            row = self._rows[(tenant, key)] = pb.UsageRow(tenant=tenant, key=key)
        return row

    def table(self) -> pb.UsageTable:
        return pb.UsageTable(rows=[self._rows[k] for k in sorted(self._rows)])
