"""The compose rig end to end: images built with no registry, the 3-region rig up,
a model added, placed, served in region and forwarded across regions, every
container stopped by its SIGTERM (none killed at the stop's timeout), and
everything down again (scripts/compose_rig.py; under a minute with the base
image built and the dependencies' layer cached, a few more from nothing).
Selected deliberately: `pytest -m compose`,
which `make test` runs beside lint. It needs a Docker engine that answers,
or root and apt to install and start Debian's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.compose


def _rig():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "compose_rig", ROOT / "scripts" / "compose_rig.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compose_rig"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1500)
def test_the_compose_rig_places_serves_and_forwards() -> None:
    rig = _rig()
    try:
        assert rig.main([]) == 0
    except rig.EngineUnavailable as exc:
        pytest.skip(f"no Docker engine here: {exc}")
    # Nothing left running: an engine the run started is stopped; one that was
    # already running holds none of the rig's containers.
    if not rig.engine_answers():
        return
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={rig.PROJECT}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert left == []
