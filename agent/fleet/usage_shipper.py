"""The agent's half of usage records: each closed minute of the usage journal
(observability/usage.py) folded into records and sent to the control plane
(`AgentService.ReportUsage`), its file removed only once the control plane has
acknowledged it. A minute sent twice (a lost acknowledgement, a restart between
sending and removing) replaces itself there: nothing is lost or counted twice."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.observability.usage import Journal
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.usage import fold, report_of

log = logging.getLogger("edgeplex.agent.usage")

Send = Callable[[pb.UsageReport], Awaitable[object]]
REFUSED = ".refused"  # a minute the control plane will never take, kept for an operator


class Refused(Exception):
    """The control plane refused a minute for what it is (sending it again would be
    refused again), not for being away."""


async def ship_closed(journal: Journal, site_id: str, send: Send) -> int:
    """Send every closed minute, oldest first, removing each file once acknowledged;
    stops at the first that fails (tried again next time). A minute refused for
    what it is would stop every later one for good: its file is renamed
    `<minute>.counts.refused`, kept and said at ERROR, and the next minutes go.
    Returns how many went."""
    sent = 0
    for minute, path in journal.closed():
        records = fold(path, journal.interval_s)
        try:
            await send(report_of(site_id, minute, journal.interval_s, records))
        except Refused as exc:
            kept = path.with_name(path.name + REFUSED)
            path.rename(kept)
            METRICS.usage_refused.inc()
            log.error("usage of minute %d refused by the control plane (%s): kept in %s",
                      minute, exc, kept)  # fmt: skip
            continue
        path.unlink(missing_ok=True)
        sent += 1
    return sent


async def run(journal: Journal, site_id: str, send: Send, every_s: float) -> None:
    """Ship closed minutes every `every_s` while the agent runs. A failure is said
    once, and its end; the tries between are DEBUG (the link says the control plane
    is away on its own)."""
    failing = False
    while True:
        try:
            await ship_closed(journal, site_id, send)
            if failing:
                log.info("usage records sent again")
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the control plane away, or Redis behind it: later
            if failing:
                log.debug("usage records not sent yet: %s", exc)
            else:
                log.warning("usage records not sent yet: %s", exc)
            failing = True
        await asyncio.sleep(every_s)
