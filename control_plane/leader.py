"""Leader election by a Redis lease: `SET edgeplex:leader <replica> NX PX <lease>`.

The holder renews every lease/3 with a compare-and-extend script, so only the
holder can extend or release it. A replica that cannot reach Redis stops
considering itself leader at once (it cannot know whether its lease still
holds), and tries again every RETRY_S until Redis answers; a standby takes over
at most one lease period after the leader dies.
A leader that holds the lease again within one lease period of losing Redis (a
Redis failover, a blip) resumes its term: its own lease was still there, or
the key was gone (a failover can lose the last writes) and nobody else had
taken it, which another replica could have done only once the old lease had
run out. So `since`, the start of the term, stays what it was, and the
planner need not wait for the fleet's reports again.

The lease is counted on this side too: from the moment the call that won or
renewed it was sent, for 90% of its length. A process stopped or stalled past
that (SIGSTOP, a paused VM, a loop blocked) no longer leads when it runs again,
before it has heard anything from Redis: by then another replica may lead, and
what this one remembers of the fleet is as old as its pause.

Owned by one task (`run`); `is_leader` may be read from any task on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from edgeplex.control_plane.redis_client import text as _text

log = logging.getLogger("edgeplex.control_plane.leader")

KEY = "edgeplex:leader"
# After Redis failed, the lease is tried again this soon (not a third of the lease
# later): a failover's new primary is taken up within it, and placement resumes.
RETRY_S = 0.25
# The share of a lease this side does not count on: the renewal's own time and the
# difference between this host's clock rate and Redis's.
DRIFT = 0.1

_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class LeaderLease:
    def __init__(self, redis: aioredis.Redis, replica_id: str, lease_s: float) -> None:
        self._redis = redis
        self.replica_id = replica_id
        self._lease_ms = max(1, int(lease_s * 1000))
        self._held = False  # won or renewed, as Redis last said
        self._valid_until = 0.0  # monotonic: the lease is surely this replica's until then
        self.since = 0.0  # wall time this replica's term as the leader began
        # Wall time since which this replica has led without a break: a term begun
        # or resumed, or the lease taken again after it lapsed here (a pause). The
        # planner judges a site's silence only from then (planner.py, _heard_from).
        self.hearing_since = 0.0
        self._term = (0.0, 0.0)  # the last term's start, and when it was left
        self._redis_ok = True
        self.changed = asyncio.Event()  # set on every change of leadership

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads now: Redis gave it the lease, and the time the
        lease was given for has not run out since (counted from the call's start)."""
        return self._held and time.monotonic() < self._valid_until

    async def run(self) -> None:
        while True:
            pause = self._lease_ms / 3000
            if self._held and not self.is_leader:
                # Paused or stalled past the lease: stepped down when it ran out.
                ran_out = time.time() - (time.monotonic() - self._valid_until)
                log.warning(
                    "%s held the leader lease past its time (%.1f s late): stepping down",
                    self.replica_id, time.monotonic() - self._valid_until,
                )  # fmt: skip
                self._change(False, ran_out)
            asked = time.monotonic()
            try:
                held = await self._try_acquire()
            except RedisError as exc:
                pause = min(pause, RETRY_S)
                if self._held:
                    log.warning("lost Redis (%s): stepping down", exc)
                elif self._redis_ok:
                    log.warning("Redis unavailable (%s): cannot take the leader lease", exc)
                self._redis_ok = False
                held = False
            else:
                self._redis_ok = True
            if held:
                self._valid_until = asked + self._lease_ms / 1000 * (1 - DRIFT)
            if held != self._held:
                self._change(held)
            await asyncio.sleep(pause)

    def _change(self, held: bool, left: float | None = None) -> None:
        """Leading or not, from now; `left`: when the lease was lost, if before now."""
        now = time.time()
        began, last_left = self._term
        resumed = bool(began) and now - last_left < self._lease_ms / 1000
        if not held:
            self._term, self.since = (self.since, now if left is None else left), 0.0
            state = "a standby"
        elif resumed:
            self.since, state = began, "the leader again (its term resumed)"
        else:
            self.since, state = now, "the leader"
        if held:
            self.hearing_since = now
        self._held = held
        self.changed.set()
        log.info("%s is %s", self.replica_id, state)

    async def _try_acquire(self) -> bool:
        if self._held:
            return bool(await self._redis.eval(_EXTEND, 1, KEY, self.replica_id, self._lease_ms))
        won = await self._redis.set(KEY, self.replica_id, nx=True, px=self._lease_ms)
        if won:
            return True
        holder = await self._redis.get(KEY)
        if holder is not None and _text(holder) == self.replica_id:
            # Our own lease from before a Redis blip: extend it.
            return bool(await self._redis.eval(_EXTEND, 1, KEY, self.replica_id, self._lease_ms))
        return False

    async def holder(self) -> str:
        raw = await self._redis.get(KEY)
        return _text(raw) if raw else ""

    async def release(self) -> None:
        with contextlib.suppress(RedisError):
            await self._redis.eval(_RELEASE, 1, KEY, self.replica_id)
        self._held = False
