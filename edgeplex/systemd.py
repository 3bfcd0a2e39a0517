"""sd_notify without libsystemd: READY, STOPPING, STATUS and the watchdog.

systemd passes `NOTIFY_SOCKET` (a Unix datagram socket; a leading '@' means
the abstract namespace) to a `Type=notify` service, and `WATCHDOG_USEC` when
the unit sets `WatchdogSec=`. Outside systemd every call is a no-op.

`watchdog()` is a coroutine for the process's event loop: it pings at half
the watchdog period, so a loop that stops turning (a deadlock, a blocking
call) gets the process restarted by systemd.
"""

from __future__ import annotations

import asyncio
import os
import socket


def notify(*states: str) -> bool:
    """Send e.g. notify("READY=1", "STATUS=serving"). True when systemd got it."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto("\n".join(states).encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval_s() -> float | None:
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


async def watchdog() -> None:
    interval = watchdog_interval_s()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
