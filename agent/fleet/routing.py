"""Where a request is served: here, at a peer, or nowhere. A pure policy.

The core asks it once per request (`Agent.route`), for both front doors:

1. A request another site forwarded is served here or fails here (no loops).
2. A model loaded here is served here, and so is one whose live sequences are
   here (their state is here: promoted again if it left).
3. A peer is worth it only when reaching it is predicted faster than promoting
   the model here: a peer's latency against this site's promotion estimate
   (staged: its last measured promotion, or its staged bytes at the rate of
   this site's promotions; cached, or no promotion measured here yet: unknown,
   so any peer wins). Peers with no headroom (when the routes carry it) are
   skipped unless every holder is busy and the model is not here; peers that
   failed recently are skipped; the rest go nearest first.
4. Otherwise a model in this site's repository is promoted here.
5. Otherwise no site can serve it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Where(StrEnum):
    LOCAL = "local"
    FORWARD = "forward"
    NOWHERE = "nowhere"


@dataclass(frozen=True, slots=True)
class Local:
    loaded: bool
    promote_estimate_s: float | None  # None: unknown (never promoted from this tier)
    sequences: bool = False  # a stateful model's live sequences are here


@dataclass(frozen=True, slots=True)
class PeerOption:
    site_id: str
    latency_s: float | None = None  # one way, from the routes; None: unknown
    headroom: float | None = None  # share of capacity free; None: not reported


@dataclass(frozen=True, slots=True)
class Route:
    where: Where
    peers: tuple[str, ...] = ()  # site ids to try, best first


def choose_route(local: Local | None, peers: list[PeerOption], forwarded: bool) -> Route:
    if forwarded or (local is not None and (local.loaded or local.sequences)):
        return Route(Where.LOCAL if local is not None else Where.NOWHERE)
    usable = [p for p in peers if p.headroom is None or p.headroom > 0]
    if not usable and local is None:
        usable = list(peers)  # every holder is busy; a busy peer beats no site at all
    usable.sort(key=lambda p: float("inf") if p.latency_s is None else p.latency_s)
    if usable and local is not None and local.promote_estimate_s is not None:
        nearest = usable[0].latency_s
        if nearest is not None and 2 * nearest >= local.promote_estimate_s:
            return Route(Where.LOCAL)  # promoting here beats the round trip
    if usable:
        return Route(Where.FORWARD, tuple(p.site_id for p in usable))
    return Route(Where.LOCAL if local is not None else Where.NOWHERE)
