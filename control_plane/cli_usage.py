"""`edgeplex admin usage`: what tenants used, summed from the sites' minute records,
by model, site or hour, as a table, JSON or CSV; from the control plane, or with
`--journal DIR` from a standalone agent's own usage journal (its `usage_dir`)."""

from __future__ import annotations

import argparse
import csv
import datetime
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Call = Callable[[str, Any], Any]
COLUMNS = ("tenant", "key", "requests", "failures", "bytes_in", "bytes_out", "compute_s",
           "cold_starts", "device_byte_seconds")  # fmt: skip
GROUPS = ("model", "site", "hour", "day", "month")  # usage.GROUPS, without importing it


def add_usage_noun(nouns: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    usage = nouns.add_parser(
        "usage", parents=[common], help="what tenants used, from the sites' usage records"
    )
    usage.add_argument("--tenant", default="", help="one tenant (default: every one)")
    since = usage.add_mutually_exclusive_group()
    since.add_argument("--from", dest="from_", type=_moment, default=0.0, metavar="TIME",
                       help="ISO 8601 start (UTC if no zone)")  # fmt: skip
    since.add_argument(
        "--last", type=_hours, default=0, metavar="SPAN",
        help="the last hours or days up to now (24h, 7d): this hour so far and those "
        "before it, so that no hour is cut",
    )  # fmt: skip
    usage.add_argument("--to", type=_moment, default=0.0, metavar="TIME",
                       help="ISO 8601 end, exclusive (default: now)")  # fmt: skip
    usage.add_argument(
        "--by", choices=GROUPS, default="model", help="rows per (model); times in UTC"
    )
    usage.add_argument("--csv", action="store_true", help="print CSV (for a billing system)")
    usage.add_argument(
        "--journal", type=Path,
        help="a standalone agent's usage_dir instead of the control plane (the minute in "
        "progress included)",
    )  # fmt: skip
    usage.add_argument(
        "--interval-s", type=int, default=60,
        help="with --journal: the agent's usage_interval_s (default 60)",
    )  # fmt: skip
    usage.set_defaults(call=_usage)


def journal_call(directory: Path, interval_s: int) -> Call:
    """`call` for a usage journal: GetUsage answered from its minute files, folded as
    the agent folds them before it sends them (the site is the directory's name)."""
    from edgeplex.control_plane.usage import summarize
    from edgeplex.usage import fold, minute_files, report_of

    def call(method: str, query: Any) -> Any:
        if not directory.is_dir():
            raise FileNotFoundError(f"no usage journal at {directory}")
        reports = [
            report_of(directory.name, minute, interval_s, fold(path, interval_s))
            for minute, path in minute_files(directory)
        ]
        return summarize(reports, query.tenant, query.from_time, query.to_time, query.by)

    return call


def _moment(text: str) -> float:
    """An ISO 8601 time (UTC if it names no zone), as unix seconds."""
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:64]!r} is not an ISO 8601 time (2026-12-01, 2026-12-01T08:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _hours(text: str) -> int:
    """A span such as 24h or 7d, in hours."""
    found = re.fullmatch(r"([0-9]{1,5})([hd])", text)
    if found is None or int(found[1]) == 0:
        raise argparse.ArgumentTypeError(f"{text[:64]!r} is not a span such as 24h or 7d")
    return int(found[1]) * (24 if found[2] == "d" else 1)


def _usage(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.control_plane.usage import last_hours
    from edgeplex.proto import edgeplex_control_pb2 as pb

    from_time = args.from_
    if args.last:
        if args.to:
            raise SystemExit("error: --last reads up to now: give --from with --to")
        from_time = last_hours(time.time(), args.last)
    query = pb.UsageQuery(tenant=args.tenant, from_time=from_time, to_time=args.to, by=args.by)
    table = call("GetUsage", query)
    if not args.csv:
        return table
    out = csv.writer(sys.stdout)
    out.writerow(COLUMNS)
    for row in table.rows:
        out.writerow([getattr(row, c) for c in COLUMNS])
    return None
