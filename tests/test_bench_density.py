"""The density benchmark's oracle bound: the throughput no residency policy
beats on the machine that measured the two ceilings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _density():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "bench"))
    path = ROOT / "bench" / "density_closed_loop.py"
    spec = importlib.util.spec_from_file_location("density_closed_loop", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zipf_share_of_the_most_requested_models() -> None:
    density = _density()
    # 1/rank over 16 models: the first four take (1 + 1/2 + 1/3 + 1/4) / H(16).
    assert density.zipf_share(4, 16) == pytest.approx(2.0833 / 3.3807, abs=1e-4)
    assert density.zipf_share(16, 16) == pytest.approx(1.0)
    assert density.zipf_share(16, 160) == pytest.approx(3.3807 / 5.6557, abs=1e-4)


def test_the_bound_mixes_the_two_ceilings_by_time_per_request() -> None:
    density = _density()
    # Half the requests at 2,000 req/s and half at 1,000: 0.75 ms each on average.
    assert density.oracle_bound(0.5, 2000.0, 1000.0) == pytest.approx(1000 / 0.75)
    assert density.oracle_bound(1.0, 2000.0, 1000.0) == pytest.approx(2000.0)
    assert density.oracle_bound(0.0, 2000.0, 1000.0) == pytest.approx(1000.0)
    # The figures of one run on a 2-core host: 4x cannot reach 0.9 of its ceiling there.
    bound = density.oracle_bound(density.zipf_share(4, 16), 2010.0, 1455.0)
    assert bound / 2010.0 < 0.9
