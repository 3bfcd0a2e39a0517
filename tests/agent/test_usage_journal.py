"""The usage journal: counters per (tenant, model, version, failure) in its minute's
file, folded into one record per (tenant, model, version); an entry cut short by a
crash is not counted; device memory is attributed by share of requests; closed
minutes are shipped oldest first and their files removed only once acknowledged;
an older agent's line files are still folded."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgeplex.agent.fleet.usage_shipper import Refused, run, ship_closed
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.observability.usage import BatchUsage, Journal
from edgeplex.usage import COUNTS, MAGIC, entries, fold, key_bytes


def counts_file(key: tuple[str, str, str, str], requests: int = 1) -> bytes:
    """A minute file with one entry of `requests` requests for `key`."""
    text = key_bytes(key)
    words = [MAGIC << 32 | len(text), requests] + [1] * (COUNTS - 1)
    head = b"".join(w.to_bytes(8, sys.byteorder) for w in words)
    return head + text + bytes(-len(text) % 8)


def test_counts_fold_into_records(tmp_path: Path) -> None:
    journal = Journal(tmp_path, interval_s=60)
    journal.record("acme", "m", "1", "", 100, 40, 0.002, True, 1000)
    journal.record("acme", "m", "1", "REJECTED", 100, 0, 0.0, False, 1000)
    journal.record("zeta", "m", "1", "", 50, 20, 0.001, False, 1000)
    journal.record("zeta", "m", "1", "", 50, 20, 0.001, False, 1000)
    journal.close()
    (path,) = tmp_path.glob("*.counts")
    with path.open("ab") as cut:  # a crash while adding an entry: its head not yet stored
        cut.write(bytes(8) + (5).to_bytes(8, sys.byteorder) + bytes(40) + b'["acme","m","1",""]')
    assert path.stat().st_size < 400  # counters, not a line per request
    acme, zeta = fold(path, 60)
    assert (acme.tenant, acme.requests, acme.failures) == ("acme", 2, {"REJECTED": 1})
    assert (acme.bytes_in, acme.bytes_out, acme.cold_starts) == (200, 40, 1)
    assert acme.compute_s == pytest.approx(0.002)
    assert (zeta.requests, zeta.bytes_in, zeta.compute_s) == (2, 100, pytest.approx(0.002))
    # 1000 bytes for 60 s, half of the model's requests each.
    assert acme.device_byte_seconds == pytest.approx(30_000)
    assert zeta.device_byte_seconds == pytest.approx(30_000)


def test_closed_minutes_ship_oldest_first_and_go_once_acknowledged(tmp_path: Path) -> None:
    journal = Journal(tmp_path, interval_s=60, grace_s=2)
    for minute in (100, 101, 102):
        (tmp_path / f"{minute}.counts").write_bytes(counts_file(("t", "m", "1", "")))
    sent: list[int] = []

    async def send(report) -> None:  # type: ignore[no-untyped-def]
        if report.minute == 101 and 101 not in sent:
            sent.append(101)
            raise ConnectionError("the control plane is away")
        sent.append(report.minute)

    closed = journal.closed(now=102 * 60 + 3)  # 101 ended 3 s ago (grace 2 s); 102 runs
    assert [m for m, _ in closed] == [100, 101]
    with pytest.raises(ConnectionError):
        asyncio.run(ship_closed(journal, "site", send))
    assert sorted(p.stem for p in tmp_path.glob("*.counts")) == ["101", "102"]
    # Tried again (by the real clock every minute here has closed): 101 and 102 go.
    asyncio.run(ship_closed(journal, "site", send))
    assert sent == [100, 101, 101, 102] and not list(tmp_path.glob("*.counts"))


def test_a_minute_refused_for_what_it_is_is_kept_aside_and_the_rest_go(tmp_path: Path) -> None:
    """A refusal that sending again cannot change (the control plane's
    INVALID_ARGUMENT) does not hold back every later minute: the refused one is
    renamed and kept for an operator, the others are sent."""
    journal = Journal(tmp_path, interval_s=60, grace_s=2)
    for minute in (100, 101, 102):
        (tmp_path / f"{minute}.counts").write_bytes(counts_file(("t", "m", "1", "")))
    sent: list[int] = []

    async def send(report) -> None:  # type: ignore[no-untyped-def]
        if report.minute == 101:
            raise Refused("at most 100000 records a minute")
        sent.append(report.minute)

    refused = METRICS.usage_refused._value.get()
    assert asyncio.run(ship_closed(journal, "site", send)) == 2
    assert sent == [100, 102]
    assert METRICS.usage_refused._value.get() == refused + 1
    assert [p.name for p in tmp_path.iterdir()] == ["101.counts.refused"]
    assert [m for m, _ in journal.closed()] == []  # not sent again


def test_a_killed_writer_keeps_every_request_and_a_restart_counts_on(tmp_path: Path) -> None:
    """The journal is a shared mapping: counts stored in it are on disk once the
    process is gone, SIGKILL included, though its file was never closed."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None and writer.stdout.readline() == "written\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    (path,) = tmp_path.glob("*.counts")
    (record,) = fold(path, 60)
    assert (record.tenant, record.requests, record.bytes_in) == ("acme", 5000, 5000 * 7)
    assert record.compute_s == pytest.approx(5.0)
    ((*_, end),) = entries(path.read_bytes())
    with path.open("r+b") as cut:  # as if killed while adding an entry: no head yet
        cut.seek(end + 8 * 7)
        cut.write(b'["zeta","m","1",""]')
    # Restarted within the same minute (the test's minute is a day long): counts on
    # in the entries there, and adds new ones over the one cut short.
    journal = Journal(tmp_path, interval_s=86_400)
    journal.record("acme", "m", "1", "", 7)
    journal.record("zeta", "m", "1", "", 9)
    journal.close()
    acme, zeta = fold(path, 60)
    assert (acme.requests, zeta.requests, zeta.bytes_in) == (5001, 1, 9)
    assert [key for key, *_ in entries(path.read_bytes())] == [
        ("acme", "m", "1", ""),
        ("zeta", "m", "1", ""),
    ]


def test_an_older_agents_line_files_are_folded_and_sent(tmp_path: Path) -> None:
    """Minutes an agent wrote as one line per request, before counters, are still
    read: an upgrade with minutes unsent loses none."""
    (tmp_path / "100.usage").write_bytes(
        b"acme\tm\t1\t\t7\t3\t1000\t1\t100\n"
        b"acme\tm\t1\tREJECTED\t7\t0\t0\t0\t100\n"
        b"acme\tm\t1\t\t7\t0"  # cut short by a crash: not counted
    )
    Journal(tmp_path, interval_s=60).record("acme", "m", "1", "", 7)
    sent = []

    async def send(report) -> None:  # type: ignore[no-untyped-def]
        sent.append((report.minute, report.records[0].requests, dict(report.records[0].failures)))

    asyncio.run(ship_closed(Journal(tmp_path, interval_s=60), "site", send))
    assert sent[0] == (100, 2, {"REJECTED": 1}) and len(sent) == 1
    assert not (tmp_path / "100.usage").exists()


def test_names_that_do_not_exist_cannot_grow_a_minute_without_bound(tmp_path: Path) -> None:
    journal = Journal(tmp_path, interval_s=86_400)
    for i in range(20_000):
        journal.record("acme", f"no-such-model-{i}", "1", "NOT_FOUND")
    journal.close()
    (path,) = tmp_path.glob("*.counts")
    records = fold(path, 60)
    assert len(records) == 16_385 and records[0].model == ""
    assert sum(r.requests for r in records) == 20_000
    assert records[0].requests == 20_000 - 16_384


WRITER = """
import sys, time
from pathlib import Path
from edgeplex.agent.observability.usage import BatchUsage, Journal
journal = Journal(Path(sys.argv[1]), interval_s=86_400)
for _ in range(5000):
    journal.record("acme", "m", "1", "", 7, 3, 0.001, False, 100)
print("written", flush=True)
time.sleep(60)
"""


def test_admin_usage_reads_a_standalone_agents_journal(tmp_path: Path) -> None:
    """`edgeplex admin usage --journal DIR`: a standalone agent's usage, the minute in
    progress included, in the control plane's table."""
    journal = Journal(tmp_path, interval_s=60)
    for tenant, failure in (("acme", ""), ("acme", ""), ("acme", "REJECTED"), ("zeta", "")):
        journal.record(tenant, "m", "1", failure, 100, 40, 0.001, False, 1000)
    # Not closed: the agent is still writing this minute.
    shown = subprocess.run(
        [sys.executable, "-m", "edgeplex", "admin", "usage", "--journal", str(tmp_path),
         "--tenant", "acme", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (row,) = json.loads(shown.stdout)["rows"]
    assert (row["tenant"], row["key"], row["requests"], row["failures"]) == (
        "acme",
        "m:1",
        "3",
        "1",
    )  # int64: JSON strings
    assert row["bytes_in"] == "300"
    missing = subprocess.run(
        [sys.executable, "-m", "edgeplex", "admin", "usage", "--journal", str(tmp_path / "no")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 1 and "no usage journal" in missing.stderr


def test_admin_usage_reads_the_last_hours_and_names_a_bad_time(tmp_path: Path) -> None:
    """`--last 24h` / `--last 7d`: up to now, from the start of an hour (no hour cut);
    a time or span it cannot read is named, and nothing is asked."""
    journal = Journal(tmp_path, interval_s=60)
    journal.record("acme", "m", "1", "", 100, 40, 0.001, False, 1000)

    def usage(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgeplex", "admin", "usage", "--journal", str(tmp_path),
             "--json", *options],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    for span in ("1h", "7d"):
        shown = usage("--last", span)
        assert shown.returncode == 0, shown.stderr
        (row,) = json.loads(shown.stdout)["rows"]
        assert (row["tenant"], row["requests"]) == ("acme", "1")
    future = usage("--from", "2999-01-01")
    assert future.returncode == 0 and json.loads(future.stdout).get("rows", []) == []
    for options, named in (
        (("--from", "yesterday"), "'yesterday' is not an ISO 8601 time"),
        (("--last", "0d"), "'0d' is not a span"),
        (("--last", "1w"), "'1w' is not a span"),
        (("--last", "1d", "--from", "2026-12-01"), "not allowed with argument --last"),
    ):
        refused = usage(*options)
        assert refused.returncode == 2 and named in refused.stderr, (options, refused.stderr)
    refused = usage("--last", "1d", "--to", "2026-12-01")
    assert refused.returncode == 1 and "--last reads up to now" in refused.stderr


@dataclass
class Asked:
    """A request as the batcher hands it to BatchUsage."""

    tenant: str
    batch_size: int = 1
    outputs: list[str] | None = None
    cold_start: str = ""


@dataclass
class Version:
    name: str = "m"
    version: str = "1"
    device_bytes: int = 1000


def test_a_batch_is_counted_per_tenant_by_its_rows(tmp_path: Path) -> None:
    journal = Journal(tmp_path, interval_s=86_400)
    count = BatchUsage(journal, Version())
    outputs = {"a": np.zeros((6, 4), np.float32), "b": np.zeros((6, 2), np.float32)}
    # One tenant's whole batch: its totals at once.
    count([Asked("acme", 2, cold_start="staged"), Asked("acme", 4)], 2, 6, 6 * 40, outputs, 600)
    # Shared: by rows; a request that asked for `b` only is charged for `b`; the
    # fourth request timed out before the batch came back, so it is not counted
    # here, though it took its share of the batch's time.
    shared = [Asked("acme", 2), Asked("zeta", 1, ["b"]), Asked("zeta", 1)]
    count(shared, 4, 6, 6 * 40, outputs, 800)
    journal.close()
    acme, zeta = fold(next(tmp_path.glob("*.counts")), 60)
    assert (acme.requests, acme.cold_starts, acme.bytes_in) == (3, 1, 6 * 40 + 2 * 40)
    assert acme.bytes_out == 6 * 24 + 2 * 24
    assert acme.compute_s == pytest.approx((600 + 200) / 1e9)
    assert (zeta.requests, zeta.bytes_in, zeta.bytes_out) == (2, 2 * 40, 8 + 24)
    assert zeta.compute_s == pytest.approx(400 / 1e9)
    assert acme.device_byte_seconds == pytest.approx(1000 * 60 * 3 / 5)


def test_an_outage_is_said_once_and_its_end_too(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Records not sent are a warning the first time, DEBUG while the control plane
    stays away, and the time they go again is said."""
    journal = Journal(tmp_path, interval_s=60, grace_s=2)
    (tmp_path / "100.counts").write_bytes(counts_file(("t", "m", "1", "")))
    tries: list[int] = []

    async def send(report) -> None:  # type: ignore[no-untyped-def]
        tries.append(report.minute)
        if len(tries) <= 3:
            raise ConnectionError("the control plane is away")

    async def shipping() -> None:
        task = asyncio.create_task(run(journal, "site", send, every_s=0.01))
        while tmp_path.joinpath("100.counts").exists():
            await asyncio.sleep(0.01)
        task.cancel()

    with caplog.at_level(logging.DEBUG, logger="edgeplex.agent.usage"):
        asyncio.run(shipping())
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("WARNING", "usage records not sent yet: the control plane is away"),
        ("DEBUG", "usage records not sent yet: the control plane is away"),
        ("DEBUG", "usage records not sent yet: the control plane is away"),
        ("INFO", "usage records sent again"),
    ]
