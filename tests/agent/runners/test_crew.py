"""Which executions the runner's reader thread runs itself: only a short one for
an idle model, so a model never runs more executions at once than its workers."""

from __future__ import annotations

import contextlib
import threading

from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.crew import INLINE_NS, Crew, Model


def model(last_ns: int) -> Model:
    request = ipc.LoadModel(1, "m", "", "", 0, 1, False, False, "cpu", 0, 0, 1)
    return Model("m", None, ["y"], request, last_ns=last_ns)  # type: ignore[arg-type]


def test_only_a_short_execution_of_an_idle_model_runs_inline():
    m = model(last_ns=INLINE_NS // 10)
    assert m.admit()  # idle and short: the reader runs it
    assert not m.admit()  # one is in progress: this one queues
    m.execute(lambda *_: None, (None, None))
    m.execute(lambda *_: None, (None, None))
    assert m.admit()
    m.execute(lambda *_: None, (None, None))
    assert not model(last_ns=INLINE_NS).admit()  # a long one always goes to a worker


def test_an_execution_that_raises_still_counts_out():
    m = model(last_ns=0)
    assert m.admit()

    def fail(*_: object) -> None:
        raise RuntimeError("boom")

    with contextlib.suppress(RuntimeError):
        m.execute(fail, (None, None))
    assert m.admit()


def test_workers_run_queued_executions_and_leave_when_released():
    ran: list[int] = []
    done = threading.Event()

    def run(_model: Model, message: int, _payload: object) -> None:
        ran.append(message)
        if len(ran) == 3:
            done.set()

    crew = Crew(run)  # type: ignore[arg-type]
    m = model(last_ns=INLINE_NS)
    crew.assign(m)
    for i in range(3):
        assert not m.admit()
        m.work.put((i, None))
    assert done.wait(5) and ran == [0, 1, 2]
    Crew.release(m, 1)
    assert m.workers == 0
