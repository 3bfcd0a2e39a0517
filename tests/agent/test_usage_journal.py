"""The usage journal: one line per request in its minute's file, folded into one
record per (tenant, model, version); a line cut short by a crash is not counted;
device memory is attributed by share of requests; closed minutes are shipped
oldest first and their files removed only once acknowledged."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgeplex.agent.fleet.usage_shipper import ship_closed
from edgeplex.agent.observability.usage import Journal
from edgeplex.usage import fold


def test_lines_fold_into_records(tmp_path: Path) -> None:
    journal = Journal(tmp_path, interval_s=60)
    journal.record("acme", "m", "1", "", 100, 40, 0.002, True, 1000)
    journal.record("acme", "m", "1", "REJECTED", 100, 0, 0.0, False, 1000)
    journal.record("zeta", "m", "1", "", 50, 20, 0.001, False, 1000)
    journal.record("zeta", "m", "1", "", 50, 20, 0.001, False, 1000)
    journal.close()
    (path,) = tmp_path.glob("*.usage")
    with path.open("ab") as cut:
        cut.write(b"acme\tm\t1\t\t999")  # a crash mid-line: not counted
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
        (tmp_path / f"{minute}.usage").write_text("t\tm\t1\t\t1\t1\t1\t0\t1\n")
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
    assert sorted(p.stem for p in tmp_path.glob("*.usage")) == ["101", "102"]
    # Tried again (by the real clock every minute here has closed): 101 and 102 go.
    asyncio.run(ship_closed(journal, "site", send))
    assert sent == [100, 101, 101, 102] and not list(tmp_path.glob("*.usage"))


def test_a_killed_writer_keeps_every_whole_line_and_a_restart_appends(tmp_path: Path) -> None:
    """The journal is a shared mapping: lines copied into it are on disk once the
    process is gone, SIGKILL included, though its file was never closed."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None and writer.stdout.readline() == "written\n"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    (path,) = tmp_path.glob("*.usage")
    assert path.stat().st_size > 5000 * 20  # still the mapping's size: a zeroed tail
    (record,) = fold(path, 60)
    assert (record.tenant, record.requests, record.bytes_in) == ("acme", 5000, 5000 * 7)
    with path.open("r+b") as cut:  # as if killed mid-line: a line without its newline
        cut.seek(path.read_bytes().rfind(b"\n") + 1)
        cut.write(b"acme\tm\t1\t\t7\t0")
    # Restarted within the same minute (the test's minute is a day long): appended
    # after the last whole line, over the cut one.
    journal = Journal(tmp_path, interval_s=86_400)
    journal.record("zeta", "m", "1", "", 9)
    journal.close()
    acme, zeta = fold(path, 60)
    assert (acme.requests, zeta.requests, zeta.bytes_in) == (5000, 1, 9)
    assert path.read_bytes().endswith(b"\n") and b"\0" not in path.read_bytes()


WRITER = """
import sys, time
from pathlib import Path
from edgeplex.agent.observability.usage import Journal
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
