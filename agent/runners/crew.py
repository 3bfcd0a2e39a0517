"""A runner's models and the worker threads that execute them.

Each loaded model has a work queue its workers take executions from; the
crew keeps idle worker threads parked between models. The runner's reader
thread is the only producer of work, which is what lets it run a short
execution itself when the model is idle (Model.admit).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import onnxruntime as ort

from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.shared_graphs import WithWeights

# An execution this short runs on the reader thread when its model is idle: the
# hand-off to a worker thread (a wake-up and a GIL transfer) would cost more
# than the execution, and nothing else waits on the reader meanwhile for long.
INLINE_NS = 300_000


@dataclass
class Model:
    name: str
    session: ort.InferenceSession | WithWeights  # replaced whole when it changes
    output_names: list[str]
    request: ipc.LoadModel
    work: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    workers: int = 0
    queued: int = 0  # executions queued or running, under `lock`
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_ns: int = INLINE_NS  # the last execution's compute time
    weights: object = None  # what the session's memory lies in, kept while it lives

    def admit(self) -> bool:
        """Count one execution in (called by the reader thread, the only producer).
        True when nothing else is queued or running and the last execution was
        short: the reader then runs it itself instead of waking a worker."""
        with self.lock:
            self.queued += 1
            return self.queued == 1 and self.last_ns < INLINE_NS

    def execute(self, run: Callable[[Model, ipc.Infer, memoryview], None], item: tuple) -> None:
        try:
            run(self, *item)
        finally:
            with self.lock:
                self.queued -= 1


class Crew:
    """Worker threads, parked between models: a load takes a parked worker rather
    than start a thread (a start waits twice for the GIL the busy runner holds)."""

    def __init__(self, run: Callable[[Model, ipc.Infer, memoryview], None]) -> None:
        self._run = run
        self._parked: queue.SimpleQueue[queue.SimpleQueue[Model]] = queue.SimpleQueue()

    def assign(self, model: Model) -> None:
        try:
            inbox = self._parked.get_nowait()
        except queue.Empty:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True).start()
        model.workers += 1
        inbox.put(model)

    @staticmethod
    def release(model: Model, count: int) -> None:
        """`count` of the model's workers leave it once the work queued before is done
        (the session is freed when the last one drops it)."""
        for _ in range(min(count, model.workers)):
            model.work.put(None)
            model.workers -= 1

    def _serve(self, inbox: queue.SimpleQueue[Model]) -> None:
        while True:
            model = inbox.get()
            while (item := model.work.get()) is not None:
                model.execute(self._run, item)
            del model, item
            self._parked.put(inbox)
