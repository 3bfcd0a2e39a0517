"""The control plane's stop, step by step: a step that hangs or fails is named in
the log and the stop goes on (tests/control_plane/test_fleet.py stops a real one
on SIGTERM)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from edgeplex.control_plane.server import _within


def test_a_step_that_hangs_is_cut_off_and_named(caplog: pytest.LogCaptureFixture) -> None:
    async def hangs() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise ConnectionError("Redis went away")

    async def stop() -> float:
        started = time.monotonic()
        await _within("the hanging step", hangs(), 0.2)
        await _within("the failing step", fails(), 0.2)
        await _within("the quick step", asyncio.sleep(0), 0.2)
        return time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="edgeplex.control_plane"):
        took = asyncio.run(stop())
    assert took < 1.0
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "shutdown: the hanging step took over 0.2 s; stopping without it",
        "shutdown: the failing step failed: Redis went away",
    ]
