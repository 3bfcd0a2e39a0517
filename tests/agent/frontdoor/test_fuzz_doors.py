"""Coverage-guided fuzzing of the doors' decoders (bench/fuzz_doors.py, atheris)
for a short budget each, from the committed seed corpora: a crash, a hang, a
leaked gate pass or a 5xx from the HTTP door fails the test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SECONDS = 2


@pytest.mark.parametrize("target", ["oip_body", "grpc_request", "http1", "h2_session", "grpc_door"])
def test_fuzzing_finds_nothing(target, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "tests" / "fuzz_corpus" / target, corpus)
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fuzz_doors.py"), target,
         f"-max_total_time={SECONDS}", "-timeout=5", "-rss_limit_mb=2048",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=SECONDS + 120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done" in run.stderr, run.stderr[-2000:]
