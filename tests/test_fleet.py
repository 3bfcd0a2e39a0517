"""edgeplex/fleet.py, what the agent and the control plane share: an MQTT session
whose broker went away ends without an error left for asyncio to report."""

from __future__ import annotations

import asyncio
import gc
import signal
from pathlib import Path

import pytest

from edgeplex.fleet import mqtt_session, parse_mqtt_url
from tests.services import Mosquitto


async def test_a_session_whose_broker_went_away_leaves_no_error_unread(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path)
    broker.start()
    reported: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    connected = asyncio.Event()

    async def hold() -> None:  # as the control plane's publisher does, until it stops
        async with mqtt_session(**parse_mqtt_url(broker.url()).client_kwargs()):
            connected.set()
            await asyncio.Event().wait()

    try:
        session = asyncio.create_task(hold())
        await asyncio.wait_for(connected.wait(), 10)
        broker.stop(signal.SIGKILL)
        await asyncio.sleep(0.5)  # the client sees its connection drop
        session.cancel()  # the process stops
        with pytest.raises(asyncio.CancelledError):
            await session
        del session
        gc.collect()  # an unread error is reported when its future is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
        broker.stop()
    assert not reported, reported
