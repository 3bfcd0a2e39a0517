"""The profiling mode's summary of py-spy's folded stacks: shares of the active
samples per function, on the stack and at its top, and each thread's busy share."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _profile():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(
        "profile_agent", ROOT / "bench" / "profile_agent.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_folded_stacks_become_shares_per_function_and_thread(tmp_path: Path) -> None:
    folded = tmp_path / "agent.folded"
    folded.write_text(
        "thread (1): MainThread;run (loop.py:1);infer (http.py:10);dumps (json.py:5) 60\n"
        "thread (1): MainThread;run (loop.py:1);select (selectors.py:2) 20\n"
        "thread (7): Thread-1 (_poll);poll (grpc.py:3) 20\n"
    )
    text, figures = _profile().summarise(folded, expected=100)
    table = text.split("\n\n")[1].splitlines()[1:]  # total %, self %, function
    rows = {line[19:]: line.split()[:2] for line in table}
    assert rows["run (loop.py:1)"] == ["80.0", "0.0"]  # on the stack in 80 of 100 samples
    assert rows["dumps (json.py:5)"] == ["60.0", "60.0"]  # at the top in all of them
    assert figures["active_samples"] == 100
    assert figures["busy_MainThread"] == 0.8 and figures["busy_Thread-1 (_poll)"] == 0.2
