"""The simulator checked against the real thing: a 30-minute trace replayed on the
rig (3 regions x 2 sites, 30x faster, the control loop's periods scaled alike)
and in the simulator; served-in-region share and cold starts agree within 10%.

The goal is the median of five replays with the agents' defaults (bench/
sim_vs_rig.py --replays 5: 1.02 and 1.07, docs/benchmarks.md). One replay is
what the suite has time for, so this test runs the agents with kept mappings
off, where the rig's cold starts vary least (679-707 in three replays, against
624-738 with them on): a guard on the simulator's fidelity that does not fail
on the rig's own spread.

bench/sim_vs_rig.py does the work and documents what is compared.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (network namespaces)"),
]
ROOT = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("sim_vs_rig", ROOT / "bench" / "sim_vs_rig.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_the_simulator_agrees_with_the_rig(tmp_path: Path) -> None:
    bench = _bench()
    report = bench.run(
        bench.parse(["--out", str(tmp_path), "--compression", "30", "--no-kept-mapping"])
    )
    print(json.dumps(report, indent=2))
    rig, sim = report["rig"], report["sim"]
    assert rig["requests"] == sim["requests"] > 1000
    assert rig["failed"] <= 0.002 * rig["requests"], rig
    ratio = report["ratio"]
    assert 0.9 <= ratio["served_in_region_within_slo"] <= 1.1, (rig, sim)
    # The rig's cold starts move with the machine's timing: 657 to 776 in seven
    # replays of this trace on one 2-vCPU machine in one day, against the
    # simulator's 683 (docs/benchmarks.md), and 805 against 699 in one run of the
    # whole suite (1.15; 687 in the next). 10% is the fidelity measured, over five
    # replays; this guard of one allows the rig's own spread on top.
    assert 0.8 <= ratio["cold_starts"] <= 1.2, (rig, sim)
