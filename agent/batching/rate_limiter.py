"""Triton's rate limiter (the agent's `rate_limit: execution_count`): a batch runs
only while it holds its model's resources, taken from one pool that every model
of the agent shares, and given back when the batch is answered.

- A resource's count is the agent's `rate_limit_resources` where it names it;
  otherwise the largest count any model asks for, so that every model can run
  (Triton's default). A model asking for more than a named count cannot run:
  `shortfall` says why, and the agent fails the model with it.
- Models waiting for resources are served in turn by stride scheduling: each
  grant moves a model's pass on by its priority, and the waiting model with the
  lowest pass goes next, so one of priority 2 gets half the turns of one of
  priority 1 while both wait (Triton's weighting). The line is kept in order:
  a model whose resources do not fit yet holds the ones behind it, so a model
  that asks for much is never starved by many that ask for little.
- A model that comes back to the line after an idle spell starts at the pass of
  the last grant: it keeps no credit from the time it did not wait.

Bookkeeping only, on the agent's event loop: nothing here waits. A batcher
(batcher.py) holds one `Gate` and waits on its own wake-up for a grant.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping


class RateLimiter:
    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self.named = dict(counts or {})  # counts the operator set: never grown
        self.counts = dict(self.named)
        self.free = dict(self.named)
        self._line: list[tuple[float, int, Gate]] = []  # (pass, arrival, gate), in order
        self._arrivals = itertools.count()
        self._virtual = 0.0  # the pass of the last grant

    def shortfall(self, need: Mapping[str, int]) -> str:
        """Why a model asking for `need` can never run here ("" when it can)."""
        for name, count in sorted(need.items()):
            if name in self.named and count > self.named[name]:
                return (
                    f"its rate limiter asks for {count} of resource '{name}', and the agent "
                    f"has {self.named[name]} (rate_limit_resources)"
                )
        return ""

    def gate(self, need: Mapping[str, int], priority: int) -> Gate:
        """A model's way through: `need` held by each of its batches while it runs.
        Resources the operator did not count grow to the largest need."""
        for name, count in need.items():
            if name not in self.named and count > self.counts.get(name, 0):
                self.free[name] = self.free.get(name, 0) + count - self.counts.get(name, 0)
                self.counts[name] = count
        return Gate(self, dict(need), max(1, priority))

    @property
    def waiting(self) -> int:
        return len(self._line)

    def view(self) -> dict[str, object]:
        """The pool as the agent's memory view shows it: each resource's count, what
        is free of it now and whether the operator set the count; models in line."""
        return {
            "resources": {
                name: {"count": count, "free": self.free[name], "set": name in self.named}
                for name, count in sorted(self.counts.items())
            },
            "waiting": self.waiting,
        }

    # --- for Gate --------------------------------------------------------------------------

    def _fits(self, need: Mapping[str, int]) -> bool:
        return all(self.free.get(name, 0) >= count for name, count in need.items())

    def _take(self, gate: Gate) -> None:
        for name, count in gate.need.items():
            self.free[name] -= count
        gate.pass_ = max(gate.pass_, self._virtual)
        self._virtual = gate.pass_
        gate.pass_ += gate.stride
        gate.pending = True

    def _give_back(self, need: Mapping[str, int]) -> None:
        for name, count in need.items():
            self.free[name] += count
        self._grant()

    def _join(self, gate: Gate) -> None:
        gate.pass_ = max(gate.pass_, self._virtual)
        gate.waiting = True
        bisect.insort(self._line, (gate.pass_, next(self._arrivals), gate), key=_order)
        self._grant()

    def _leave(self, gate: Gate) -> None:
        self._line = [entry for entry in self._line if entry[2] is not gate]
        gate.waiting = False
        self._grant()  # the gate may have held the ones behind it

    def _grant(self) -> None:
        """Grant the line's head while its resources fit; it is told at once."""
        while self._line and self._fits(self._line[0][2].need):
            _, _, gate = self._line.pop(0)
            gate.waiting = False
            self._take(gate)
            gate.on_grant()


def _order(entry: tuple[float, int, Gate]) -> tuple[float, int]:
    return entry[0], entry[1]


class Gate:
    """One model's place at the pool. `pending`: granted, and the batcher has not
    started the batch yet; `running`: its batches that hold resources now."""

    __slots__ = (
        "_limiter", "need", "on_grant", "on_wait", "pass_", "pending", "running", "stride",
        "waiting",
    )  # fmt: skip

    def __init__(self, limiter: RateLimiter, need: dict[str, int], stride: int) -> None:
        self._limiter = limiter
        self.need = need
        self.stride = stride
        self.pass_ = 0.0
        self.pending = False
        self.waiting = False
        self.running = 0
        self.on_grant: Callable[[], None] = _nothing  # the batcher's wake-up
        self.on_wait: Callable[[], None] = _nothing  # counts each turn in line

    def take_now(self) -> bool:
        """Granted at once, when nobody waits and the resources are free."""
        limiter = self._limiter
        if self.pending:
            return True
        if limiter._line or not limiter._fits(self.need):
            return False
        limiter._take(self)
        return True

    def ask(self) -> bool:
        """Granted now (True), or in line to be told by `on_grant` (False; `on_wait`
        when it joins the line)."""
        if self.pending or self.take_now():
            return True
        if not self.waiting:
            self._limiter._join(self)
            if not self.pending:
                self.on_wait()
        return self.pending

    def started(self) -> None:
        """The grant's batch went to the runner: it holds the resources until `done`."""
        self.pending = False
        self.running += 1

    def done(self) -> None:
        """A batch started under this gate is answered: its resources go back."""
        self.running -= 1
        self._limiter._give_back(self.need)

    def withdraw(self) -> None:
        """Nothing to run now (the queue emptied, the model stopped serving): leave the
        line, and give back a grant not used."""
        if self.waiting:
            self._limiter._leave(self)
        if self.pending:
            self.pending = False
            self._limiter._give_back(self.need)


def _nothing() -> None:
    pass
