"""The simulator checked against the real thing: a 20-minute trace replayed on the
rig (3 regions x 2 sites, 30x faster, the control loop's periods scaled alike)
and in the simulator; served-in-region share and cold starts agree within 10%.

The goal is the median of five replays of the 30-minute trace with the agents'
defaults (bench/sim_vs_rig.py --replays 5: 1.02 and 0.99, docs/benchmarks.md).
One shorter replay is what the suite has time for (three placement rounds
counted, about 1,200 requests: 50 s against 73 s for 30 minutes; three replays
of it measured 1.01-1.04 in service and 0.96-1.02 in cold starts, 2026-12-07),
so this test runs the agents with kept mappings off, where the rig's cold
starts vary least, as a guard on the simulator's fidelity. The rig's own
spread still puts a replay outside the guard's band now and then (574 cold
starts in one CI run of the 30-minute trace, with 649-749 the usual range): a
replay outside it is followed by two more, and the median of the three is
judged, as the bench judges five. The replay cannot be made much faster: the
simulator scales the rig's promotion (about 0.95 ms) by the compression, 28 ms
here against the 50 ms SLO; at 45x (43 ms) a slower machine would cross the SLO,
and at 60x the simulator counted no cold start at all (2026-12-07).

bench/sim_vs_rig.py does the work and documents what is compared.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
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


def _within_guard(ratio: dict[str, float]) -> bool:
    # The rig's cold starts move with the machine's timing: 649 to 776 in ten
    # replays of this trace on one 2-vCPU machine (docs/benchmarks.md) against the
    # simulator's 687-698. 10% is the fidelity measured, over five replays; this
    # guard of one allows the rig's own spread on top.
    return 0.9 <= ratio["served_in_region_within_slo"] <= 1.1 and 0.8 <= ratio["cold_starts"] <= 1.2


@pytest.mark.timeout(900)
def test_the_simulator_agrees_with_the_rig(tmp_path: Path) -> None:
    bench = _bench()
    argv = ["--out", str(tmp_path), "--minutes", "20", "--compression", "30", "--no-kept-mapping"]
    report = bench.run(bench.parse(argv))
    print(json.dumps(report, indent=2))
    rigs, sim = [report["rig"]], report["sim"]
    ratios = [report["ratio"]]
    if not _within_guard(ratios[0]):
        more = bench.run(bench.parse([*argv, "--replays", "2"]))
        print(json.dumps(more, indent=2))
        rigs += more["replays"]
        ratios += [replay["ratio"] for replay in more["replays"]]
    for rig in rigs:
        assert rig["requests"] == sim["requests"] > 1000
        assert rig["failed"] <= 0.002 * rig["requests"], rig
    median = {key: statistics.median(r[key] for r in ratios) for key in ratios[0]}
    assert _within_guard(median), (ratios, rigs, sim)
