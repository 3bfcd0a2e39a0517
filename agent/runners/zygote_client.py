"""The agent's client of the zygote: starts it with exec, asks it to fork runners,
and hears from it when a runner exits. Runs on the agent's event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable

from edgeplex.agent.oip.errors import Unavailable
from edgeplex.agent.runners import framing, ipc

log = logging.getLogger("edgeplex.agent.runners")


# What of the agent's environment the zygote, and so every runner, inherits: names
# that tune libraries, never the agent's own settings (EDGEPLEX_AGENT_*: its join
# token, admin token, keys) nor anything else a deployment put there.
KEPT_ENVIRONMENT = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
KEPT_PREFIXES = ("LC_", "OMP_", "OPENBLAS_", "MKL_", "ORT_", "CUDA_", "NVIDIA_", "PYTHON")


def runner_environment(environ: dict[str, str]) -> dict[str, str]:
    """The zygote's environment: the allowed names of `environ`, threads pinned to 1."""
    env = {k: v for k, v in environ.items() if k in KEPT_ENVIRONMENT or k.startswith(KEPT_PREFIXES)}
    return env | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class ZygoteClient:
    """Starts the zygote with exec and asks it to fork runners."""

    def __init__(self, on_exit: Callable[[str, int, int], None], sandbox: str = "off") -> None:
        self._on_exit = on_exit
        self._sandbox_mode = sandbox
        self.sandbox: dict[str, str] = {}  # its report: what a runner gets on this host
        # Asked at each start when runners use CUDA: does CUDA work in the sandbox?
        self.cuda_probe: ipc.SpawnRunner | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._spawned: dict[str, asyncio.Future[int]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._stopping = False

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "edgeplex.agent.runners.zygote",
            "--fd",
            str(child.fileno()),
            "--sandbox",
            self._sandbox_mode,
            pass_fds=[child.fileno()],
            stdin=asyncio.subprocess.DEVNULL,
            env=runner_environment(dict(os.environ)),
        )
        child.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=parent)
        try:
            report, _ = await asyncio.wait_for(framing.read_frame(reader), 60)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            raise Unavailable(f"the runner zygote did not start: {exc!r}") from None
        if not isinstance(report, ipc.SandboxReport):
            raise Unavailable(f"the runner zygote said {type(report).__name__} first")
        self.sandbox = dict(report.layers)
        if self.cuda_probe is not None and self._sandbox_mode != "off":
            framing.write_frame(self._writer, self.cuda_probe)
            try:
                cuda, _ = await asyncio.wait_for(framing.read_frame(reader), 60)
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
                said = f"the runner zygote did not answer its CUDA probe: {exc!r}"
                raise Unavailable(said) from None
            if isinstance(cuda, ipc.SandboxReport):
                self.sandbox |= cuda.layers
        self._reader_task = asyncio.create_task(self._read(reader), name="zygote-reader")
        log.info("zygote started (pid %d)", self._process.pid)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message, _ = await framing.read_frame(reader)
                if isinstance(message, ipc.RunnerSpawned):
                    future = self._spawned.pop(message.runner_id, None)
                    if future is not None and not future.done():
                        future.set_result(message.pid)
                elif isinstance(message, ipc.RunnerExited):
                    self._on_exit(message.runner_id, message.pid, message.status)
        except (asyncio.IncompleteReadError, ConnectionError, ipc.ProtocolError):
            pass
        for future in self._spawned.values():
            if not future.done():
                future.set_exception(Unavailable("the runner zygote exited"))
        self._spawned.clear()
        if self._stopping:
            log.debug("zygote connection closed")
        else:  # the zygote died: the next spawn starts another
            log.warning("zygote connection closed: it is started again for the next runner")

    async def spawn(self, request: ipc.SpawnRunner) -> int:
        """Have the zygote start a runner; its pid as this process sees it."""
        async with self._lock:
            if not self.alive:
                await self.start()
        assert self._writer is not None
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._spawned[request.runner_id] = future
        framing.write_frame(self._writer, request)
        return await asyncio.wait_for(future, timeout=10)

    def kill(self, runner_id: str, sig: int) -> None:
        if self._writer is not None and self.alive:
            framing.write_frame(self._writer, ipc.KillRunner(runner_id, int(sig)))

    async def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True  # its connection closing now is expected
        if self._writer is not None:
            self._writer.close()
        if self._process is not None and self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), timeout)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        if self._reader_task is not None:
            self._reader_task.cancel()
