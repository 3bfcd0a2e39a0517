"""bench/gpu_check.sh must keep working: CI runs it on the CPU with --dry-run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_writes_its_json(tmp_path):
    subprocess.run(
        [str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
        check=True,
        timeout=420,
        capture_output=True,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["bandwidth"]["pinned"]["best_gb_per_s"] > 0
    assert {row["prepack_weights"] for row in summary["swap_in"]} == {True, False}
    assert all(row["promote_over_transfer"] > 0 for row in summary["swap_in"])
    assert all("create" in row["stages_ms"] for row in summary["swap_in"])
    assert [row["concurrency"] for row in summary["serving"]["rows"]] == [1, 4]
    assert all(row["ratio"] > 0 for row in summary["serving"]["rows"])
    scenarios = {row["scenario"]: row for row in summary["density"]}
    assert set(scenarios) == {"ceiling-16", "4x"}
    assert all(row["served"] > 0 and row["failed"] == 0 for row in scenarios.values())
