"""The zygote: a clean process that forks runners on request.

The agent starts it with exec (`python -m edgeplex.agent.runners.zygote --fd N`)
before it starts gRPC or asyncio, and talks to it over the inherited socket N.
The zygote imports numpy, onnxruntime and the runner code, so a fork pays for
none of that, but it never creates a session, never starts gRPC or asyncio and
never starts threads of its own: a fork copies only the calling thread, and
state those would leave behind (locks, event loops, OpenMP pools) breaks the
child. See docs/architecture.md, "Why a zygote".

Messages in: SpawnRunner, KillRunner. Messages out: SandboxReport (first, what
a sandboxed runner gets on this host), RunnerSpawned, RunnerExited. A runner is
cloned into its own namespaces and sandboxed before it runs (sandbox.py); its
memory group is joined before it runs too. It exits when the agent's end of the socket closes, after
sending SIGTERM to its runners, and dies with the agent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import selectors
import signal
import socket
import sys
import traceback

# Keep BLAS/OpenMP pools single-threaded until a runner sizes its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import contextlib

import numpy  # noqa: F401  (preloaded for the children)
import onnxruntime  # noqa: F401

from edgeplex.agent.runners import framing, ipc, runner, sandbox, seccomp

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Zygote:
    def __init__(self, control: socket.socket, sandbox_mode: str = "off") -> None:
        self._control = control
        self._uid, self._gid = os.geteuid(), os.getegid()
        # Why runners get no namespaces here ("" while they do): learnt once.
        self._no_namespaces = "" if sandbox_mode != "off" else "runner.sandbox is off"
        self._seccomp: bytes | None = None  # the runners' filter, compiled once
        self._children: dict[int, str] = {}  # pid -> runner id
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent decides when we stop
        signal.signal(signal.SIGTERM, lambda *_: self._shutdown())

    def report_sandbox(self, mode: str) -> None:
        """Tell the agent, first thing, what a sandboxed runner gets on this host."""
        layers: dict[str, str] = {}
        if mode != "off":
            with contextlib.suppress(seccomp.Unavailable):  # each runner says why not
                self._seccomp = seccomp.compile_filter()
            probe = ipc.SpawnRunner("probe", "", "INFO", 0, sandbox="best_effort")
            layers = sandbox.probe(probe, self._seccomp)
            self._no_namespaces = "" if layers["namespaces"] == sandbox.ON else layers["namespaces"]
        framing.send_frame(self._control, ipc.SandboxReport(layers))

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._control, selectors.EVENT_READ, "control")
        selector.register(self._wake_r, selectors.EVENT_READ, "signal")
        while True:
            for key, _ in selector.select():
                if key.data == "signal":
                    os.read(self._wake_r, 4096)
                    self._reap()
                    continue
                try:
                    message, _ = framing.recv_frame(self._control)
                except (EOFError, ConnectionError):
                    self._shutdown()
                if isinstance(message, ipc.SpawnRunner):
                    self._spawn(message)
                elif isinstance(message, ipc.KillRunner):
                    for pid, runner_id in self._children.items():
                        if runner_id == message.runner_id:
                            _kill(pid, message.signal)

    def _spawn(self, request: ipc.SpawnRunner) -> None:
        if request.probe_cuda:
            verdict = sandbox.probe_cuda(request, self._seccomp)
            framing.send_frame(self._control, ipc.SandboxReport({"cuda": verdict}))
            return
        go_read, go_write = os.pipe()  # the child waits on it until it is in its groups
        if request.sandbox == "off" or self._no_namespaces:
            pid, no_namespaces = os.fork(), self._no_namespaces or "runner.sandbox is off"
        else:
            pid, no_namespaces = sandbox.clone_or_fork()
        if pid == 0:
            code = 0
            try:
                os.close(go_write)
                os.read(go_read, 1)
                os.close(go_read)
                self._become_runner(request, no_namespaces)
            except sandbox.SandboxError as exc:
                print(f"runner {request.runner_id}: {exc}", file=sys.stderr, flush=True)
                code = sandbox.EX_CONFIG
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(go_read)
        for procs in request.cgroups:
            try:
                with open(procs, "w") as f:
                    f.write(str(pid))
            except OSError as exc:
                print(f"runner {request.runner_id}: cannot join {procs}: {exc}", file=sys.stderr)
        os.close(go_write)
        self._children[pid] = request.runner_id
        framing.send_frame(self._control, ipc.RunnerSpawned(request.runner_id, pid))

    def _become_runner(self, request: ipc.SpawnRunner, no_namespaces: str) -> None:
        pid = int(os.readlink("/proc/self"))  # as the agent sees it, before /proc changes
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._control.close()
        die_with_parent()
        layers: dict[str, str] = {}
        timings: dict[str, int] = {}
        if request.sandbox != "off":
            confined = sandbox.Sandbox(request, self._uid, self._gid, self._seccomp)
            layers, timings = confined.apply(no_namespaces), confined.timings_us
        elif request.rlimit_as:
            resource.setrlimit(resource.RLIMIT_AS, (request.rlimit_as, request.rlimit_as))
        runner.main(
            request.runner_id,
            request.socket_path,
            request.log_level,
            "json" if request.log_format == "json" else "text",
            request.idle_spin_us,
            pid=pid,
            sandbox=layers,
            sandbox_us=timings,
        )

    def _reap(self) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            runner_id = self._children.pop(pid, "?")
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                framing.send_frame(self._control, ipc.RunnerExited(runner_id, pid, code))

    def _shutdown(self) -> None:
        for pid in list(self._children):
            _kill(pid, signal.SIGTERM)
        os._exit(0)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def main() -> None:
    parser = argparse.ArgumentParser(description="edgeplex runner zygote (started by the agent)")
    parser.add_argument("--fd", type=int, required=True, help="inherited control socket")
    parser.add_argument("--sandbox", choices=("off", "best_effort", "required"), default="off")
    args = parser.parse_args()
    die_with_parent()
    control = socket.socket(fileno=args.fd)
    try:
        zygote = Zygote(control, args.sandbox)
        zygote.report_sandbox(args.sandbox)
        zygote.serve()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
