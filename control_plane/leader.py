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

The control plane runs the lease on a thread of its own, with an event loop and
a Redis connection of its own (`run_on_thread`): on the process's loop, busy with
a thousand sites' reports and a round, a renewal waited its turn twice (to send,
then to read the reply) and the lease lapsed although the loop had not stopped.
The thread counts the process's loop as running while a heartbeat from it is
younger than the lease's time, and never holds the lease past that: a loop that
stands still still stops leading when its time runs out.

Owned by one task (`run`); `is_leader` may be read from any task on any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

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
BEAT_S = 0.25  # how often the process's loop says it runs (run_on_thread)

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
        self._notify: Callable[[], None] = self.changed.set
        # On a thread (run_on_thread): when the process's loop last ran, and the thread.
        self._beat: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads now: Redis gave it the lease, the time the lease
        was given for has not run out since (counted from the call's start), and the
        process's loop has run within that time (run_on_thread)."""
        return self._held and time.monotonic() < self._valid_until and self._loop_runs()

    async def run(self) -> None:
        while True:
            pause = self._lease_ms / 3000
            if self._held and not self.is_leader:
                # Paused or stalled past the lease (or the process's loop stood still
                # past it, run_on_thread): stepped down when that time ran out.
                ended = self._valid_until
                if self._beat is not None:
                    ended = min(ended, self._beat + self._lease_ms / 1000 * (1 - DRIFT))
                late = time.monotonic() - ended
                log.warning(
                    "%s held the leader lease past its time (%.1f s late): stepping down",
                    self.replica_id, late,
                )  # fmt: skip
                self._change(False, time.time() - late)
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

    def _loop_runs(self) -> bool:
        """Whether the process's loop has run within the lease's time (always, when
        the lease runs on that loop)."""
        return self._beat is None or time.monotonic() < self._beat + self._lease_ms / 1000 * (
            1 - DRIFT
        )

    async def run_on_thread(self) -> None:
        """`run` on a thread of its own (module doc), while this task beats for the
        process's loop; cancelled, the thread releases the lease and ends."""
        main = asyncio.get_running_loop()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the process's loop closed
                main.call_soon_threadsafe(self.changed.set)

        self._notify = notify
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._on_thread, name="leader lease", daemon=True)
        self._thread.start()
        try:
            while True:
                self._beat = time.monotonic()
                await asyncio.sleep(BEAT_S)
        finally:
            await self.release()

    def _on_thread(self) -> None:
        async def main() -> None:
            task = asyncio.create_task(self.run())
            while not self._stop.is_set() and not task.done():
                await asyncio.sleep(0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self._release_here()
            with contextlib.suppress(RedisError):
                await self._redis.aclose()

        asyncio.run(main())

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
        self._notify()
        log.info("%s is %s", self.replica_id, state)

    async def _try_acquire(self) -> bool:
        if not self._loop_runs():
            return False  # the process's loop stands still: let the lease lapse
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
        """Give the lease up (on its thread, which then ends, when it runs on one)."""
        if self._thread is None:
            await self._release_here()
            return
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 2.0)

    async def _release_here(self) -> None:
        with contextlib.suppress(RedisError):
            await self._redis.eval(_RELEASE, 1, KEY, self.replica_id)
        self._held = False
