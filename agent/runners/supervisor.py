"""Agent side of the runner processes: the supervisor (the zygote client is zygote_client.py).

Everything here runs on the agent's event loop. RunnerPool owns the zygote
and every RunnerProcess; the model table (models.py) is told about runners
going down and coming back through the two callbacks it passes in, and never
touches processes itself.

A RunnerProcess is a small state machine (RunnerState, its moves in TRANSITIONS):

    stopped --ensure_ready--> starting --hello--> ready --lost--> restarting
                                                    ^                 |
                                                    +-- backoff, hello+
    any state --stop/retire--> closed (final)

A start that fails stays where it is (starting, restarting) and retries after a
backoff.

Callers never check-then-act: they `await ensure_ready()` and `await call()`
(or `send()`, which writes the frame before it returns and hands back the
reply's future). A call whose runner dies before answering raises
RunnerLost; the batcher decides whether to re-dispatch. Replies resolve
their futures from the connection's read callback (connection.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import RunnerLost, Unavailable
from edgeplex.agent.runners import ipc, leftovers, shm
from edgeplex.agent.runners.awake import AwakeWaits
from edgeplex.agent.runners.connection import RunnerConnection, drop
from edgeplex.agent.runners.limits import MemoryLimiter
from edgeplex.agent.runners.sandbox import ON
from edgeplex.agent.runners.settings import RunnerSettings
from edgeplex.agent.runners.view import RunnerView
from edgeplex.agent.runners.zygote_client import ZygoteClient

log = logging.getLogger("edgeplex.agent.runners")
_NAMED = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)


class RunnerState(StrEnum):
    STOPPED = "stopped"  # never started
    STARTING = "starting"  # spawned (or retrying), its Hello awaited
    READY = "ready"  # serving
    RESTARTING = "restarting"  # lost; a new process is on its way, after a backoff
    CLOSED = "closed"  # the agent is stopping, or no model needs it any more


# Every move a runner makes; anything else is a bug (RunnerProcess._enter raises).
TRANSITIONS: dict[RunnerState, frozenset[RunnerState]] = {
    RunnerState.STOPPED: frozenset({RunnerState.STARTING, RunnerState.CLOSED}),
    RunnerState.STARTING: frozenset({RunnerState.READY, RunnerState.CLOSED}),
    RunnerState.READY: frozenset({RunnerState.RESTARTING, RunnerState.CLOSED}),
    RunnerState.RESTARTING: frozenset({RunnerState.READY, RunnerState.CLOSED}),
    RunnerState.CLOSED: frozenset(),
}
HELLO_TIMEOUT_S = 10.0  # a connection on the runners' socket must say who it is by then


class RunnerProcess:
    """One runner: its connection, its pending calls and its restart policy."""

    def __init__(self, runner_id: str, pool: RunnerPool) -> None:
        self.runner_id = runner_id
        self.state = RunnerState.STOPPED
        self.pid: int | None = None
        self.restarts = 0
        self._pool = pool
        self._conn: RunnerConnection | None = None
        self._channel: shm.AgentChannel | None = None  # shared tensor rings, if mapped
        self._pending: dict[int, asyncio.Future[tuple[ipc.Message, memoryview]]] = {}
        self._ready = asyncio.Event()
        self._hello: asyncio.Future[RunnerConnection] | None = None
        self._task: asyncio.Task[None] | None = None
        self._backoff = pool.settings.restart_backoff_initial_s
        self._started_at = 0.0
        self.last_loss = ""  # why it last went down
        self.sandbox: dict[str, str] = {}  # its layers, as its Hello reported them
        self.sandbox_us: dict[str, int] = {}  # and what each took to apply
        self._log_level = pool.log_level  # what it was told to log at

    # --- public ---------------------------------------------------------------------------

    async def ensure_ready(self) -> None:
        """Start the runner if it is stopped and wait until it serves."""
        if self.state == RunnerState.CLOSED:
            raise Unavailable("the agent is shutting down")
        if self.state == RunnerState.STOPPED:
            self._enter(RunnerState.STARTING)
            self._task = asyncio.create_task(self._start_loop(0.0), name=f"start-{self.runner_id}")
        await self._ready.wait()

    async def call(
        self, message: ipc.Message, buffers: list[memoryview] | None = None
    ) -> tuple[ipc.Message, memoryview]:
        """Send a request carrying `req_id` and wait for its reply; RunnerLost if it dies."""
        future = self.send(message, buffers)
        try:
            return await future
        finally:
            self._pending.pop(message.req_id, None)  # type: ignore[attr-defined]

    def post(self, message: ipc.Message) -> None:
        """Write a request whose answer nobody waits for; RunnerLost if not serving (a
        runner lost later is its supervision's to handle)."""
        self.send(message).add_done_callback(_unheard)

    def send(
        self, message: ipc.Message, buffers: list[memoryview] | None = None
    ) -> asyncio.Future[tuple[ipc.Message, memoryview]]:
        """Write a request carrying `req_id` now; the future resolves with its reply, or
        RunnerLost if the runner dies first. Raises RunnerLost if it is not serving."""
        if self.state != RunnerState.READY:
            raise RunnerLost(self.runner_id)
        return self._send(message, buffers)

    def _send(
        self, message: ipc.Message, buffers: list[memoryview] | None
    ) -> asyncio.Future[tuple[ipc.Message, memoryview]]:
        if self._conn is None:
            raise RunnerLost(self.runner_id)
        future: asyncio.Future[tuple[ipc.Message, memoryview]] = self._conn.loop.create_future()
        if isinstance(message, ipc.Infer):
            buffers = buffers or []
            size = sum(b.nbytes for b in buffers)
            shared = self._channel is not None and self._channel.send(message, buffers, size)
            if shared:
                buffers = None
            METRICS.tensor_bytes["request", shared].inc(size)
        self._pending[message.req_id] = future  # type: ignore[attr-defined]
        self._conn.write(message, buffers)
        return future

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self._pool.zygote.kill(self.runner_id, sig)

    def abandon(self, reason: str) -> None:
        """The runner is hung: kill it and treat it as lost now, before its connection
        closes, so no batch is sent to it in between (the model pauses at once)."""
        if self.state != RunnerState.READY:
            return
        self.kill()
        self._lost(reason)

    async def stop(self) -> None:
        if self.state != RunnerState.CLOSED:
            self._enter(RunnerState.CLOSED)
        if self._task is not None:
            self._task.cancel()
        self._detach()
        self._close_channel()
        self._fail_pending()

    def _detach(self) -> None:
        """Forget the connection: what it still delivers, or its closing, is ignored."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.on_frame, conn.on_lost = drop, None
            conn.close()

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # --- called by the pool ----------------------------------------------------------------

    def accept(self, hello: ipc.Hello, conn: RunnerConnection) -> bool:
        pid = hello.pid
        if self._hello is None or self._hello.done() or (self.pid is not None and pid != self.pid):
            return False
        self.sandbox = dict(hello.sandbox)
        self.sandbox_us = dict(hello.sandbox_us)

        # Only the connection this runner uses speaks for it: a stale one (from a start
        # that gave up) neither delivers frames nor reports the runner lost.
        def on_frame(message: ipc.Message, payload: memoryview) -> None:
            if self._conn is conn:
                self._on_frame(message, payload)

        def on_lost(reason: str) -> None:
            if self._conn is conn:
                self._on_lost(reason)

        conn.on_frame, conn.on_lost = on_frame, on_lost
        self._hello.set_result(conn)
        return True

    def exited(self, pid: int, status: int) -> None:
        if self._hello is not None and not self._hello.done() and pid == self.pid:
            self._hello.set_exception(RunnerLost(f"runner exited with status {status}"))

    # --- internals ------------------------------------------------------------------------

    def _enter(self, state: RunnerState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"runner {self.runner_id}: {self.state} -> {state} is not a move")
        self.state = state

    async def _start_loop(self, delay: float) -> None:
        settings = self._pool.settings
        while self.state != RunnerState.CLOSED:
            if delay:
                await asyncio.sleep(delay)
            try:
                await self._start_once()
                return
            except (RunnerLost, TimeoutError, Unavailable, OSError) as exc:
                log.error("runner %s failed to start: %s", self.runner_id, exc)
                delay = min(
                    max(delay * 2, settings.restart_backoff_initial_s),
                    settings.restart_backoff_max_s,
                )

    def set_log_level(self, level: str) -> None:
        """Log at `level` from now on; a runner not serving starts with the pool's."""
        if self.state == RunnerState.READY and level != self._log_level:
            self.post(ipc.SetLogLevel(self._pool.next_req_id(), level))
            self._log_level = level

    async def _start_once(self) -> None:
        loop = asyncio.get_running_loop()
        self._hello = loop.create_future()
        self.pid = None
        self._log_level = self._pool.log_level  # spawned with it
        self.pid = await self._pool.zygote.spawn(self._pool.spawn_request(self.runner_id))
        try:
            self._conn = await asyncio.wait_for(
                asyncio.shield(self._hello), self._pool.settings.start_timeout_s
            )
            channel = await self._attach()
        except (TimeoutError, RunnerLost) as exc:
            self._hello.cancel()  # a Hello arriving after this is refused
            self.kill()
            self._detach()
            raise RunnerLost(f"runner did not start: {exc or type(exc).__name__}") from None
        self._channel = channel
        self._enter(RunnerState.READY)
        self._started_at = time.monotonic()
        self._ready.set()
        log.info("runner %s ready (pid %d)", self.runner_id, self.pid)
        self.set_log_level(self._pool.log_level)  # changed while it started
        self._pool.on_up(self.runner_id)

    async def _attach(self) -> shm.AgentChannel | None:
        """Map the shared tensor rings into the new runner, or None to use its socket."""
        settings = self._pool.settings
        size = settings.shared_memory_bytes
        if not size:
            return None
        try:
            mapping, path = shm.Mapping.create(size, size, self._pool.rings_dir)
        except OSError as exc:
            log.warning(
                "no shared memory for runner %s (%s): tensors use its socket", self.runner_id, exc
            )
            return None
        threshold = settings.shared_memory_threshold_bytes
        try:
            request = ipc.AttachShm(self._pool.next_req_id(), str(path), size, size, threshold)
            reply, _ = await asyncio.wait_for(self._send(request, None), settings.start_timeout_s)
        except BaseException:
            mapping.close()
            raise
        finally:
            path.unlink(missing_ok=True)  # both ends hold the mapping; the name can go
        if isinstance(reply, ipc.ShmAttached):
            return shm.AgentChannel(mapping, threshold)
        mapping.close()
        log.warning(
            "runner %s cannot map shared memory (%s): tensors use its socket", self.runner_id, reply
        )
        return None

    def _on_frame(self, message: ipc.Message, payload: memoryview) -> None:
        """A frame from the runner, called from the connection's read callback."""
        if self._channel is not None:
            payload = self._channel.received(message, payload)
        if isinstance(message, ipc.InferResult):
            METRICS.tensor_bytes["result", message.at >= 0].inc(payload.nbytes)
        future = self._pending.pop(getattr(message, "req_id", -1), None)
        if future is not None and not future.done():
            future.set_result((message, payload))

    def _on_lost(self, reason: str) -> None:
        if self.state == RunnerState.READY:
            self._lost(reason)
        else:  # while starting: the start fails (its calls raise RunnerLost)
            self._fail_pending()

    def _lost(self, reason: str) -> None:
        settings = self._pool.settings
        if self._pool.limiter.oom_killed(self.runner_id):
            limit = self._pool.limit_of(self.runner_id)
            reason = f"killed for exceeding its memory limit ({limit} bytes)"
            METRICS.runner_oom_kills.labels(runner=self.runner_id).inc()
        self.last_loss = reason
        log.error("runner %s (pid %s) lost: %s", self.runner_id, self.pid, reason)
        self._enter(RunnerState.RESTARTING)
        self._ready.clear()
        self._detach()
        self._close_channel()
        # Models move to LOADING before their in-flight batches fail, so the
        # batcher's re-dispatch waits for the reload instead of racing it.
        self._pool.on_down(self.runner_id, reason)
        self._fail_pending()
        self.restarts += 1
        METRICS.runner_restarts.labels(runner=self.runner_id).inc()
        if time.monotonic() - self._started_at > settings.restart_backoff_reset_s:
            self._backoff = settings.restart_backoff_initial_s
        delay = self._backoff
        self._backoff = min(self._backoff * 2, settings.restart_backoff_max_s)
        self._task = asyncio.create_task(self._start_loop(delay), name=f"start-{self.runner_id}")

    def _fail_pending(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RunnerLost(self.runner_id))
        self._pending.clear()


class RunnerPool:
    """Owns the zygote, the runners' socket and every RunnerProcess.

    on_up(runner_id) and on_down(runner_id) are called on the event loop when a
    runner starts serving and when it is lost.
    """

    def __init__(
        self,
        settings: RunnerSettings,
        log_level: str,
        on_up: Callable[[str], None],
        on_down: Callable[[str, str], None],
        log_format: str = "text",
        view: Callable[[], RunnerView] = RunnerView,
        shared_limit: int = 0,
    ) -> None:
        self.settings = settings
        self.log_level = log_level
        self.log_format = log_format
        self.on_up = on_up
        self.on_down = on_down
        self.view = view  # what a runner's sandbox holds, made anew for each start
        self.shared_limit = shared_limit
        self.zygote = ZygoteClient(self._runner_exited, settings.sandbox)
        self._runners: dict[str, RunnerProcess] = {}
        self._dir = Path(tempfile.mkdtemp(prefix=f"{leftovers.RUNTIME}{os.getpid()}-"))
        self.socket_path = str(self._dir / "runners.sock")
        # The runners' shared rings are made here (in host RAM), the one directory of
        # /dev/shm their sandbox shows them.
        rings = tempfile.mkdtemp(prefix=f"{leftovers.RINGS}{os.getpid()}-", dir=shm.shm_dir())
        self.rings_dir = Path(rings)
        leftovers.claim(self._dir)
        leftovers.claim(self.rings_dir)
        self._server: asyncio.AbstractServer | None = None
        self._req_ids = itertools.count(1)
        self.limiter = MemoryLimiter()
        self.awake = AwakeWaits(settings.reply_spin_us)
        self._round_trips: dict[str, float] = {}  # each model's last batch, sent to answered
        # Host memory limits of dedicated runners, set by the model table before
        # it first asks for the runner.
        self.memory_limits: dict[str, int] = {}
        log.info("runner memory limits use %s", self.limiter.mechanism)

    def set_log_level(self, level: int) -> None:
        """The agent's log level changed (Triton's logging extension): every runner
        logs at it, those serving now and those that start later."""
        self.log_level = logging.getLevelName(level) if level in _NAMED else str(level)
        for runner in self._runners.values():
            runner.set_log_level(self.log_level)

    def next_req_id(self) -> int:
        return next(self._req_ids)

    def run_batch(
        self, runner_id: str, model: str, outputs: list[str] | None, tensors: list[list[Any]],
        buffers: list[memoryview], timeout_s: float,
    ) -> asyncio.Future[tuple[ipc.Message, memoryview]]:  # fmt: skip
        """Send one batch of `model` to its runner now. The future is the runner's
        reply; RunnerLost when the runner is not serving or dies first; TimeoutError
        past `timeout_s` (what a hung batch means is the caller's to decide). While
        this is the only batch in flight and the model answered its last one within
        runner.reply_spin_us, the loop polls for the reply (awake.py)."""
        infer = ipc.Infer(next(self._req_ids), model, outputs, tensors)
        infer.lone = not self.awake.in_flight
        reply = self.get(runner_id).send(infer, buffers)
        self.awake.sent(reply, self._round_trips.get(model, 0.0))
        loop = reply.get_loop()
        sent = time.perf_counter()
        # A timer on the reply itself, not wait_for: no task between the answer and
        # the batch.
        timer = loop.call_later(timeout_s, _time_out, reply)

        def answered(reply: asyncio.Future[tuple[ipc.Message, memoryview]]) -> None:
            timer.cancel()
            self.awake.answered()
            if not reply.cancelled() and reply.exception() is None:
                self._round_trips[model] = time.perf_counter() - sent

        reply.add_done_callback(answered)
        return reply

    def limit_of(self, runner_id: str) -> int:
        """The host memory limit of a runner in bytes (0: none): a dedicated runner's
        model's, else the shared runner's; the shared rings count against it."""
        limit = self.memory_limits.get(runner_id, self.shared_limit)
        return limit + 2 * self.settings.shared_memory_bytes if limit else 0

    def spawn_request(self, runner_id: str, probe_cuda: bool = False) -> ipc.SpawnRunner:
        """What the zygote needs to start `runner_id`: its sandbox, view and group. With
        `probe_cuda`, no runner: the sandbox and view of one, to try CUDA's driver in."""
        limit = 0 if probe_cuda else self.limit_of(runner_id)
        view = self.view()
        return ipc.SpawnRunner(
            runner_id,
            self.socket_path,
            self.log_level,
            self.limiter.rlimit_for(limit),
            self.log_format,
            self.settings.idle_spin_us,
            sandbox=self.settings.sandbox if probe_cuda else self.sandbox_mode,
            read_only=[*view.read_only, str(self._dir)],
            writable=[*view.writable, str(self.rings_dir)],
            devices=view.devices,
            hidden=view.hidden,
            max_open_files=self.settings.max_open_files,
            cgroups=[] if probe_cuda else self.limiter.group(runner_id, limit),
            probe_cuda=probe_cuda,
        )

    @property
    def sandbox_mode(self) -> str:
        """The mode runners start with: runner.sandbox, but off where runners use CUDA
        and its driver does not initialise inside the sandbox (best_effort; required
        refuses to start instead)."""
        if self.zygote.sandbox.get("cuda", ON) != ON:
            return "off"
        return self.settings.sandbox

    def _cuda_probe(self) -> ipc.SpawnRunner | None:
        """What the zygote tries CUDA in at its start, where runners use CUDA."""
        if self.settings.execution_provider != "cuda" or self.settings.sandbox == "off":
            return None
        return self.spawn_request("cuda-probe", probe_cuda=True)

    def host_sandbox(self) -> dict[str, str]:
        """What this host gives a runner: the zygote's probe, and the memory group."""
        host = dict(self.zygote.sandbox)
        cgroup = self.limiter.mechanism.startswith("cgroup")
        host["memory_cgroup"] = ON if cgroup else f"no writable cgroup: {self.limiter.mechanism}"
        return host

    def sandbox_status(self) -> dict[str, object]:
        """What GET /edgeplex/v1/memory says of the sandbox: the mode, what this host
        gives a runner, and what each runner reported."""
        return {
            "mode": self.settings.sandbox,
            "host": self.host_sandbox(),
            "runners": {r.runner_id: r.sandbox for r in self._runners.values() if r.sandbox},
            "setup_us": {r.runner_id: r.sandbox_us for r in self._runners.values() if r.sandbox},
        }

    async def start(self) -> None:
        """Listen for runners and start the zygote; RuntimeError if runner.sandbox is
        required and this host cannot give a runner every layer."""
        os.chmod(self._dir, 0o700)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: RunnerConnection(self._hello, HELLO_TIMEOUT_S), path=self.socket_path
        )
        self.zygote.cuda_probe = self._cuda_probe()
        await self.zygote.start()
        host = self.host_sandbox()
        missing = {k: v for k, v in host.items() if v != ON}
        for layer, reason in host.items():
            METRICS.sandbox_layer.labels(layer=layer).set(reason == ON)
        if self.settings.sandbox == "off":
            log.warning("runner sandbox is off: runners run unconfined")
        elif missing and self.settings.sandbox == "required":
            raise RuntimeError(
                "runner.sandbox is required, but this host cannot provide: "
                + "; ".join(f"{k} ({v})" for k, v in missing.items())
            )
        elif "cuda" in missing:
            log.warning("runners run without their sandbox: %s", missing["cuda"])
        elif missing:
            log.warning(
                "runner sandbox without: %s",
                "; ".join(f"{k} ({v})" for k, v in missing.items()),
            )
        else:
            log.info("runner sandbox: every layer on")

    def get(self, runner_id: str) -> RunnerProcess:
        runner = self._runners.get(runner_id)
        if runner is None:
            runner = self._runners[runner_id] = RunnerProcess(runner_id, self)
        return runner

    def runners(self) -> list[RunnerProcess]:
        return list(self._runners.values())

    def pid_of(self, runner_id: str) -> int | None:
        """The pid of a serving runner (None while it is not serving)."""
        runner = self._runners.get(runner_id)
        return runner.pid if runner is not None and runner.state == RunnerState.READY else None

    def can_serve(self) -> bool:
        """False while every runner that was started is down (restarting): the agent
        is then not ready."""
        serving = (RunnerState.READY, RunnerState.STOPPED)
        runners = self._runners.values()
        return not runners or any(r.state in serving for r in runners)

    def _hello(self, conn: RunnerConnection, message: ipc.Message) -> None:
        """The first frame of a connection: a spawned runner accepts it, or it closes."""
        runner = self._runners.get(getattr(message, "runner_id", ""))
        if not isinstance(message, ipc.Hello) or runner is None or not runner.accept(message, conn):
            log.warning("rejected a runner connection that did not match a spawned runner")

    def _runner_exited(self, runner_id: str, pid: int, status: int) -> None:
        log.info("runner %s (pid %d) exited with status %d", runner_id, pid, status)
        runner = self._runners.get(runner_id)
        if runner is not None:
            runner.exited(pid, status)

    async def retire(self, runner_id: str) -> None:
        """Stop a runner that no model needs any more (a dedicated one)."""
        runner = self._runners.pop(runner_id, None)
        if runner is not None:
            await runner.stop()
        self.limiter.release(runner_id)

    async def stop(self) -> None:
        for runner in self._runners.values():
            await runner.stop()
        if self._server is not None:
            self._server.close()
        await self.zygote.stop()
        self.limiter.close()
        for path in (self._dir, self.rings_dir):
            shutil.rmtree(path, ignore_errors=True)


def _unheard(reply: asyncio.Future[tuple[ipc.Message, memoryview]]) -> None:
    if not reply.cancelled():
        reply.exception()  # retrieved, so asyncio does not log it as never retrieved


def _time_out(reply: asyncio.Future[tuple[ipc.Message, memoryview]]) -> None:
    if not reply.done():
        reply.set_exception(TimeoutError())
